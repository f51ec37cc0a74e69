"""Two source trees' engines on the real workload, alternating: before/after ratios.

    git archive BASE | tar -x -C /tmp/base        # the tree to compare against
    .venv/bin/python bench/engine_ab.py --trees /tmp/base . --export build/onnx/default \\
        --batch 64 --beam 4 [--pairs 4] [--threads 1]

Each run is a process of its own with one tree's ``service`` package on its path (the same
export, held-out sample and length-sorted batches as bench/real_peers.py), timed after an
untimed pass; the trees run A B, B A, ... ``--pairs`` times, so drift on a shared machine
falls on both. Give the same tree twice for an A/A control, or with ``--export-b`` to compare
two exports (variants of one model: fp32 against int8). Prints each run and the ratio of the
best runs (B over A, sentences per second).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = """
import json, sys, time
from bench.real_peers import batches, heldout_texts, sample, source_ids
from service.runtime.engine import Engine
export, workload, count, size, beam, threads = sys.argv[1:7]
config = json.loads(open(export + "/config.json").read())
texts = sample(heldout_texts(config.get("source_lang", "en"), workload), int(count))
sources = source_ids(__import__("pathlib").Path(export), texts)
plan = batches(sources, int(size))
engine = Engine.from_dir(export, provider="cpu", intra_op_threads=int(threads))
engine.warmup()
def run():
    started = time.perf_counter()
    for batch in plan:
        engine.translate_ids([sources[i] for i in batch], beam_size=int(beam), max_new_tokens=128)
    return time.perf_counter() - started
run()
print(json.dumps({"sentences_per_s": len(sources) / min(run(), run())}))
"""


def run_tree(tree: Path, args: argparse.Namespace, export: Path) -> float:
    bench = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{tree.resolve()}:{bench}"}
    command = [sys.executable, "-c", WORKER, str(export.resolve()), args.workload]
    command += [str(args.sentences), str(args.batch), str(args.beam), str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["sentences_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs=2, type=Path, required=True, metavar=("A", "B"))
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--export-b", type=Path, help="the export tree B runs (default: --export)")
    parser.add_argument("--workload", default="strings")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[int, list[float]] = {0: [], 1: []}
    exports = (args.export, args.export_b or args.export)
    for pair in range(args.pairs):
        for index in (0, 1) if pair % 2 == 0 else (1, 0):
            results[index].append(run_tree(args.trees[index], args, exports[index]))
            print(f"pair {pair} {'AB'[index]}: {results[index][-1]:.1f} sentences/s", flush=True)
    best = [max(results[0]), max(results[1])]
    print(
        json.dumps(
            {
                "cell": f"{args.workload} batch {args.batch} beam {args.beam} threads {args.threads}",
                "export": str(args.export),
                "export_b": str(exports[1]),
                "a": [round(x, 1) for x in results[0]],
                "b": [round(x, 1) for x in results[1]],
                "ratio_b_over_a": round(best[1] / best[0], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
