"""What the exact int8 screen of greedy steps (export/vocab_screen.py) is worth, and how often
it has to fall back.

    .venv/bin/python bench/vocab_screen.py bench/work/base/ours        # after bench/peers.py --size base
    .venv/bin/python bench/vocab_screen.py build/onnx/default --force  # a screen added for the run

Two measurements on one export:

1. **Step time by rows**, screen on against off, in one process, alternating (``--repeats``
   blocks of ``--calls`` decoder calls each way): greedy steps (top 1) of ``--rows`` rows on
   random caches (``--past`` self-attention slots, ``--source`` cross-attention slots). The
   ids of the two must be equal.
2. **Fallbacks on real text** (``--texts``, needs the export's tokenizer): the load test's UI
   strings and help paragraphs, split into sentences as the service splits them, translated greedily in batches of
   ``--batch`` by ``service.runtime.engine.Engine``. Every decoder call is made twice, screen on and
   off: the ids must be equal, and the call counts as answered by the screen when its
   ``logits`` output (the screen's int8 approximations when it answered, the full projection's
   when it fell back) differs from the full one.

``--force`` adds a screen (``--candidates`` K, ``--max-rows``) to an export that has none, in a
temporary copy: the shipped models (8,000 ids) are below the size the exporter screens.

Results: a table on stdout and ``bench/results/vocab-screen-<name>.json`` (with the machine's CPU
flags). Run it under the exclusive CPU lock; figures in BENCHMARKS.md and docs/engine.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtest.report import write_json  # noqa: E402
from service.runtime.contract import SCREEN_INPUT  # noqa: E402

STEP_OUTPUTS = ["logits", "top_log_probs", "top_ids", "watch_log_probs"]


def forced_copy(export_dir: Path, target: Path, candidates: int, max_rows: int) -> Path:
    """``export_dir`` copied to ``target`` with a screen added to its decoder."""
    import onnx

    from export.device_decoder import write_device_decoder
    from export.vocab_screen import add_vocab_screen, has_vocab_screen

    shutil.copytree(export_dir, target)
    decoder = onnx.load(target / "decoder.onnx")
    if not has_vocab_screen(decoder):
        add_vocab_screen(decoder, candidates=candidates, max_rows=max_rows)
        onnx.save(decoder, target / "decoder.onnx")
        if (target / "decoder_device.onnx").exists():
            layers = json.loads((target / "config.json").read_text())["num_layers"]
            write_device_decoder(target, layers)
    return target


def random_step(config: dict[str, Any], rows: int, past: int, source: int, seed: int) -> dict:
    """A greedy step's inputs on random caches (pad banned twice, nothing watched)."""
    rng = np.random.default_rng(seed)
    layers, heads, head_dim = config["num_layers"], config["num_heads"], config["head_dim"]
    pad = config["special_ids"]["pad_id"]
    feeds = {
        "input_ids": rng.integers(4, config["vocab_size"] - 1, (rows, 1)),
        "positions": np.full((rows, 1), past),
        "self_attention_mask": np.ones((rows, past + 1), np.int64),
        "encoder_attention_mask": np.ones((rows, source), np.int64),
        "top_k": np.array([1]),
        "banned_ids": np.full((rows, 2), pad),
        "watch_ids": np.full((rows, 1), pad),
    }
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal(
                (rows, heads, past, head_dim), np.float32
            )
            feeds[f"cross_{kind}_{i}"] = rng.standard_normal(
                (rows, heads, source, head_dim), np.float32
            )
    return feeds


def step_times(session, config, args) -> list[dict[str, Any]]:
    results = []
    for rows in args.rows:
        feeds = random_step(config, rows, args.past, args.source, seed=rows)
        times: dict[bool, list[float]] = {True: [], False: []}
        for block in range(args.repeats):
            for screen in (True, False) if block % 2 else (False, True):
                flagged = {**feeds, SCREEN_INPUT: np.array(screen)}
                session.run(["top_ids"], flagged)  # untimed
                started = time.perf_counter()
                for _ in range(args.calls):
                    session.run(["top_ids"], flagged)
                times[screen].append((time.perf_counter() - started) / args.calls)
        on, off = (
            session.run(["top_ids"], {**feeds, SCREEN_INPUT: np.array(flag)})[0]
            for flag in (True, False)
        )
        result = {
            "rows": rows,
            "screened_ms": round(statistics.median(times[True]) * 1e3, 3),
            "full_ms": round(statistics.median(times[False]) * 1e3, 3),
            "same_ids": bool(np.array_equal(on, off)),
        }
        result["ratio"] = round(result["screened_ms"] / result["full_ms"], 3)
        print(
            f"rows {rows:4d}: screened {result['screened_ms']:8.2f} ms  full "
            f"{result['full_ms']:8.2f} ms  screened/full {result['ratio']:.3f}  "
            f"same ids {result['same_ids']}",
            flush=True,
        )
        results.append(result)
    return results


class CheckedDecoder:
    """Runs every decoder call screened and full; counts and checks them."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.greedy_calls = self.answered = self.mismatches = 0

    def run(self, names: list[str], feeds: dict) -> list:
        fetched = [*STEP_OUTPUTS, *(name for name in names if name not in STEP_OUTPUTS)]
        screened = self.session.run(fetched, {**feeds, SCREEN_INPUT: np.array(True)})
        full = self.session.run(STEP_OUTPUTS, {**feeds, SCREEN_INPUT: np.array(False)})
        if feeds["top_k"][0] == 1:
            self.greedy_calls += 1
            self.answered += int(np.abs(screened[0] - full[0]).max() > 1e-3)
            self.mismatches += int(not np.array_equal(screened[2], full[2]))
        by_name = dict(zip(fetched, screened, strict=True))
        return [by_name[name] for name in names]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def text_fallbacks(export_dir: Path, args) -> dict[str, Any]:
    from loadtest.inputs import HELP_PARAGRAPHS, UI_STRINGS
    from service.runtime.engine import Engine
    from service.text.segmenter import sentence_spans
    from service.text.tokenizer import Tokenizer

    sentences = [
        text[start:end]
        for text in (*UI_STRINGS, *HELP_PARAGRAPHS)
        for start, end in sentence_spans(text, "en")
    ]
    tokenizer = Tokenizer.from_dir(export_dir)
    sources = [tokenizer.encode_one(sentence) for sentence in sentences]
    engine = Engine.from_dir(export_dir, provider="cpu", intra_op_threads=args.threads)
    checked = CheckedDecoder(engine.model.decoder)
    engine.model.decoder = checked
    for start in range(0, len(sources), args.batch):
        engine.translate_ids(sources[start : start + args.batch], max_new_tokens=args.new_tokens)
    result = {
        "sentences": len(sources),
        "batch": args.batch,
        "greedy_steps": checked.greedy_calls,
        "answered_by_screen": checked.answered,
        "fell_back": checked.greedy_calls - checked.answered,
        "steps_with_other_ids": checked.mismatches,
    }
    print(
        f"{result['sentences']} sentences in batches of {args.batch}: "
        f"{result['greedy_steps']} greedy steps, {result['answered_by_screen']} answered by the "
        f"screen, {result['fell_back']} fell back, {result['steps_with_other_ids']} with other ids",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--rows", default="1,4,8,16,32,64,128")
    parser.add_argument("--past", type=int, default=24)
    parser.add_argument("--source", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=12, help="alternating blocks per mode")
    parser.add_argument("--calls", type=int, default=5, help="decoder calls per block")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", action="store_true", help="also count fallbacks on real text")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--force", action="store_true", help="add a screen where there is none")
    parser.add_argument("--candidates", type=int, default=128)
    parser.add_argument("--max-rows", type=int, default=128)
    parser.add_argument("--results-dir", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.rows = [int(rows) for rows in args.rows.split(",")]

    with tempfile.TemporaryDirectory() as scratch:
        export_dir = args.export_dir
        if args.force:
            export_dir = forced_copy(
                export_dir, Path(scratch) / "screened", args.candidates, args.max_rows
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(
            str(export_dir / "decoder.onnx"), options, providers=["CPUExecutionProvider"]
        )
        if SCREEN_INPUT not in {value.name for value in session.get_inputs()}:
            parser.error(f"{export_dir} has no vocabulary screen (--force adds one)")
        config = json.loads((export_dir / "config.json").read_text())
        report: dict[str, Any] = {
            "export": str(args.export_dir),
            "forced": args.force,
            "vocab_size": config["vocab_size"],
            "settings": {
                key: value
                for key, value in vars(args).items()
                if key not in ("export_dir", "results_dir")
            },
            "step_times": step_times(session, config, args),
        }
        if args.texts:
            report["text_fallbacks"] = text_fallbacks(export_dir, args)
    name = args.export_dir.resolve().name + ("-forced" if args.force else "")
    path = write_json(args.results_dir / f"vocab-screen-{name}.json", report)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
