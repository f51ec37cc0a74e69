"""Decode speed of the candidate default-model architectures on this CPU, through the engine.

    .venv/bin/python bench/arch_speed.py [--threads 2] [--new-tokens 16] [--src-len 12] \
        [--archs 6x2-288,7x2-288,...] [--reference 6x2-288]

The speed half of choosing the default models' shape (the quality half is validation chrF
from training, ``models/training/train.py --arch``): every candidate named in ``--archs``
(default v2's, ``models.training.train.ARCHITECTURES``; v3's are in
``models.training.train_v3.CANDIDATES``) gets random weights with the default models' vocabulary
(8,000), is exported with the service's exporter and decoded by ``service.runtime.engine.Engine``, so
what is timed is what would be served. The eos logit is pushed to -1e4 so every run generates
exactly ``--new-tokens`` tokens. Source length 12 tokens is a typical UI string. The candidates
take turns within every repeat (best of ``--repeats`` each), so a slow spell of the machine
hits them all. Prints a table with each candidate's speed relative to ``--reference`` (v1,
``4x3-256``) and writes JSON (with the CPU flags) to bench/results/arch_speed.json. Time
nothing else on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from export.onnx_export import export_model  # noqa: E402
from loadtest.machine import machine_facts  # noqa: E402
from models.training.train import ARCHITECTURES, DEFAULT_ARCHITECTURE, model_config  # noqa: E402
from models.training.train_v3 import CANDIDATES  # noqa: E402
from models.transformer import Transformer  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402

VOCAB_SIZE = 8000
CASES = ((1, 1), (1, 8), (1, 32), (4, 1), (4, 8))  # (beam, batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--src-len", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="best of N")
    parser.add_argument(
        "--archs", default=",".join(ARCHITECTURES), help="comma-separated names of CANDIDATES"
    )
    parser.add_argument("--reference", default=DEFAULT_ARCHITECTURE, help="ratios are to this")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    rng = np.random.default_rng(0)
    sources = [rng.integers(40, VOCAB_SIZE - 1, args.src_len - 1).tolist() + [0] for _ in range(32)]
    results: dict[str, dict[str, object]] = {}
    engines: dict[str, Engine] = {}
    workdir = Path(tempfile.mkdtemp(prefix="arch_speed_"))
    for name in args.archs.split(","):
        config = model_config(
            CANDIDATES[name], VOCAB_SIZE, pad_id=VOCAB_SIZE - 1, eos_id=0, unk_id=1
        )
        torch.manual_seed(0)
        model = Transformer(config).eval()
        with torch.no_grad():
            model.final_logits_bias[0, config.eos_id] = -1e4  # fixed output length
        parameters = sum(p.numel() for p in model.parameters())
        export_model(model, workdir / name)
        engines[name] = Engine.from_dir(
            workdir / name, provider="cpu", intra_op_threads=args.threads
        )
        engines[name].warmup()
        results[name] = {
            "parameters_m": round(parameters / 1e6, 2),
            "fp16_mb": round(2 * parameters / 1e6, 1),
        }
        del model
        gc.collect()
    for beam, batch_size in CASES:
        batch = sources[:batch_size]
        best = dict.fromkeys(engines, float("inf"))
        for round_number in range(args.repeats + 1):  # round 0 warms every shape up
            for name, engine in engines.items():
                started = time.perf_counter()
                engine.translate_ids(batch, beam_size=beam, max_new_tokens=args.new_tokens)
                seconds = time.perf_counter() - started
                if round_number:
                    best[name] = min(best[name], seconds)
        for name, seconds in best.items():
            results[name][f"beam{beam}_batch{batch_size}"] = round(
                batch_size * args.new_tokens / seconds, 1
            )
    for name, row in results.items():
        print(json.dumps({"arch": name, **row}), flush=True)

    keys = [f"beam{beam}_batch{batch}" for beam, batch in CASES]
    print(f"\ntokens/s ({args.threads} threads, src {args.src_len}, {args.new_tokens} new tokens)")
    print("| arch | M params | " + " | ".join(keys) + f" | mean ratio to {args.reference} |")
    print("|" + "---|" * (len(keys) + 3))
    reference = results.get(args.reference, next(iter(results.values())))
    for name, row in results.items():
        ratio = float(np.mean([row[key] / reference[key] for key in keys]))  # type: ignore[operator]
        row[f"mean_ratio_to_{args.reference}"] = round(ratio, 3)
        cells = " | ".join(str(row[key]) for key in keys)
        print(f"| {name} | {row['parameters_m']} | {cells} | {ratio:.2f} |")
    args.output.mkdir(parents=True, exist_ok=True)
    report = {
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "src_len": args.src_len,
        "reference": args.reference,
        "machine": machine_facts(),
        "tokens_per_second": results,
    }
    (args.output / "arch_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
