"""Engine throughput against PyTorch eager (models.search, KV-cached) on the same random weights.

    .venv/bin/python bench/engine_bench.py [--size base|small|tiny] [--batches 1,8,32]
        [--new-tokens 32] [--src-len 24] [--threads 2] [--engines torch,ort20,ort23,int8]

Every run generates exactly ``--new-tokens`` tokens per sentence: the random model's logit bias
for eos is set to -1e4, so neither search stops early and tokens/s compare like for like
(tokens = batch x new tokens; for beam search, tokens of the returned hypothesis). Times include
the encoder. ``base`` is Marian/OPUS-MT-base sized (6+6 layers, d_model 512, 8 heads, FFN 2048,
vocab 58101). Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from export.onnx_export import export_model  # noqa: E402
from export.variants import make_int8, top1_agreement  # noqa: E402
from models.config import TransformerConfig  # noqa: E402
from models.search import beam_search, greedy_search  # noqa: E402
from models.transformer import Transformer  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402

SIZES = {
    "base": dict(d_model=512, layers=6, heads=8, ffn=2048, vocab=58101),
    "small": dict(d_model=256, layers=3, heads=4, ffn=1024, vocab=16000),
    "tiny": dict(d_model=64, layers=2, heads=4, ffn=256, vocab=1000),
}


def build_model(size: str) -> Transformer:
    spec = SIZES[size]
    vocab = spec["vocab"]
    config = TransformerConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=spec["d_model"],
        encoder_layers=spec["layers"],
        decoder_layers=spec["layers"],
        encoder_heads=spec["heads"],
        decoder_heads=spec["heads"],
        encoder_ffn_dim=spec["ffn"],
        decoder_ffn_dim=spec["ffn"],
        max_positions=512,
        pad_id=vocab - 1,
        decoder_start_id=vocab - 1,
    )
    torch.manual_seed(0)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.final_logits_bias[0, config.eos_id] = -1e4  # never stop early: fixed output length
    return model


def time_call(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="best of N")
    parser.add_argument("--engines", default="torch,ort20,ort23,int8")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    engines_wanted = args.engines.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    beams = [int(b) for b in args.beams.split(",")]

    model = build_model(args.size)
    config = model.config
    rng = np.random.default_rng(0)
    allowed = np.arange(1, config.src_vocab_size - 1)
    sources = [
        rng.choice(allowed, args.src_len - 1).tolist() + [config.eos_id]
        for _ in range(max(batches))
    ]

    configs = [(beam, batch_size) for beam in beams for batch_size in batches]
    rows = [{"beam": beam, "batch": batch_size} for beam, batch_size in configs]
    outputs: dict = {}

    def measure(name: str, run) -> None:
        for row, (beam, batch_size) in zip(rows, configs, strict=True):
            batch = sources[:batch_size]
            run(batch[:1], beam)  # warm this shape family
            produced: list = []
            seconds = time_call(
                lambda batch=batch, beam=beam, produced=produced: produced.append(run(batch, beam)),
                args.repeats,
            )
            row[name] = round(sum(len(h) for h in produced[-1]) / seconds, 1)
            outputs[(name, beam, batch_size)] = produced[-1]
            print(json.dumps({"engine": name, **row}), flush=True)

    # PyTorch first, before any export or ORT session exists in the process (ORT's spinning
    # worker threads would take CPU from it). On a 2-core machine shared with other jobs, eager
    # PyTorch with 2 threads intermittently ran 20-30x slower (its OpenMP threads waiting on a
    # descheduled sibling); --threads 1 gives stable figures there.
    if "torch" in engines_wanted:

        def run_torch(batch: list[list[int]], beam: int) -> list[list[int]]:
            src_ids = torch.tensor(batch)
            src_mask = torch.ones_like(src_ids)
            if beam == 1:
                return greedy_search(model, src_ids, src_mask, max_new_tokens=args.new_tokens)
            return beam_search(
                model, src_ids, src_mask, beam_size=beam, max_new_tokens=args.new_tokens
            )

        measure("torch", run_torch)

    workdir = Path(tempfile.mkdtemp(prefix="engine_bench_"))
    meta: dict = {"workdir": str(workdir), "export_seconds": {}}
    for opset in (20, 23):
        if f"ort{opset}" in engines_wanted or (opset == 20 and "int8" in engines_wanted):
            started = time.perf_counter()
            export_model(model, workdir / f"op{opset}", opset=opset)
            meta["export_seconds"][f"opset{opset}"] = round(time.perf_counter() - started, 1)
    if "int8" in engines_wanted:
        make_int8(workdir / "op20", workdir / "int8")
        meta["int8_top1_agreement"] = round(
            top1_agreement(workdir / "op20", workdir / "int8", sources[:16], steps=16), 4
        )

    # One engine at a time, then released: ORT's spinning worker threads would otherwise take
    # CPU from whichever engine is measured next.
    for name, subdir in (("ort20", "op20"), ("ort23", "op23"), ("int8", "int8")):
        if name in engines_wanted:
            engine = Engine.from_dir(
                workdir / subdir, provider="cpu", intra_op_threads=args.threads
            )
            engine.warmup()
            measure(
                name,
                lambda batch, beam, engine=engine: engine.translate_ids(
                    batch, beam_size=beam, max_new_tokens=args.new_tokens
                ),
            )
            del engine
            gc.collect()
    names = [name for name in ("torch", "ort20", "ort23", "int8") if name in engines_wanted]
    for row in rows:
        torch_out = outputs.get(("torch", row["beam"], row["batch"]))
        ort_out = outputs.get(("ort20", row["beam"], row["batch"]))
        if torch_out is not None and ort_out is not None:
            same = sum(a == b for a, b in zip(torch_out, ort_out, strict=True))
            row["ort20_identical_to_torch"] = same / row["batch"]

    header = f"| decoding | batch | {' | '.join(names)} |"
    print(
        f"\ntokens/s, size={args.size}, src {args.src_len}, {args.new_tokens} new tokens, {args.threads} threads"
    )
    print(header)
    print("|" + "---|" * (2 + len(names)))
    for row in rows:
        decoding = "greedy" if row["beam"] == 1 else f"beam {row['beam']}"
        print(
            f"| {decoding} | {row['batch']} | "
            + " | ".join(str(row[name]) for name in names)
            + " |"
        )
    print(json.dumps(meta))

    args.output.mkdir(parents=True, exist_ok=True)
    result = {
        "size": args.size,
        "spec": SIZES[args.size],
        "src_len": args.src_len,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
        **meta,
    }
    path = args.output / f"engine_bench-{args.size}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
