"""What a grown KV cache's copy costs in fresh memory against reused memory (service/runtime/buffer_pool.py).

    .venv/bin/python bench/first_touch.py                     # beam 4 x 32 at Marian-base size
    .venv/bin/python bench/first_touch.py --rows 32 --thread  # on a thread, as the engine runs

Copies 2L caches of (rows, H, length, Dh) float32 into caches of ``length + 16`` slots, as
``HostKV`` does when a cache's spare slots run out, four times (capacities growing as in a
translation), and all that twice (two translations: the second meets what the first left),
with the destination arrays
- ``fresh``: ``np.empty`` (numpy's default allocation, with its transparent-huge-page advice),
- ``mmap``: anonymous ``mmap`` pages (no huge-page advice),
- ``pooled``: a ``BufferPool`` that got back the previous copy's buffers.
Prints ms per copy and writes ``bench/results/first-touch.json``. Run it under the exclusive
CPU lock; each variant runs in a fresh process (fresh memory is what is measured).
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtest.machine import machine_facts  # noqa: E402
from service.runtime.buffer_pool import BufferPool  # noqa: E402

VARIANTS = ("fresh", "mmap", "pooled")


def copies(variant: str, rows: int, layers: int, heads: int, head_dim: int) -> list[float]:
    """ms per copy of the 2L tensors, for the capacities a growing cache passes through."""
    pool = BufferPool(np.float32)

    def destination(shape: tuple[int, ...]) -> np.ndarray:
        if variant == "fresh":
            return np.empty(shape, np.float32)
        if variant == "mmap":
            size = int(np.prod(shape)) * 4
            return np.frombuffer(mmap.mmap(-1, size), np.float32).reshape(shape)
        return pool.empty(shape)

    rng = np.random.default_rng(0)
    timings = []
    for _ in range(2):  # two translations: the second finds what the first gave back
        length = 32
        current = [
            rng.standard_normal((rows, heads, length + 16, head_dim)).astype(np.float32)
            for _ in range(2 * layers)
        ]
        for _ in range(4):
            length += 16
            started = time.perf_counter()
            grown = [destination((rows, heads, length + 16, head_dim)) for _ in current]
            for target, source in zip(grown, current, strict=True):
                target[:, :, :length] = source[:, :, :length]
                target[:, :, length:] = 0
            timings.append(1e3 * (time.perf_counter() - started))
            previous, current = current, grown
            if variant == "pooled":
                pool.recycle(previous)
            del previous
        if variant == "pooled":  # the translation finished: its cache is released
            pool.recycle(current)
        del current
    return timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--thread", action="store_true", help="copy on a non-main thread")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args(argv)
    shape = (args.rows, args.layers, args.heads, args.head_dim)
    if args.variant:
        result: list[list[float]] = []
        work = lambda: result.append(copies(args.variant, *shape))  # noqa: E731
        if args.thread:
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
        else:
            work()
        print(json.dumps(result[0]))
        return
    results = {}
    for variant in VARIANTS:
        child = [sys.executable, __file__, "--variant", variant, "--rows", str(args.rows)]
        child += ["--layers", str(args.layers), "--heads", str(args.heads)]
        child += ["--head-dim", str(args.head_dim)] + (["--thread"] if args.thread else [])
        output = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(output.strip().splitlines()[-1])
        megabytes = 2 * args.layers * args.rows * args.heads * 64 * args.head_dim * 4 / 1e6
        first, second = results[variant][:4], results[variant][4:]
        timings = (
            " ".join(f"{ms:.0f}" for ms in first) + " | " + " ".join(f"{ms:.0f}" for ms in second)
        )
        print(f"{variant:7s} ms per copy (about {megabytes:.0f} MB), 1st | 2nd: {timings}")
    out = Path(__file__).resolve().parent / "results" / "first-touch.json"
    out.parent.mkdir(exist_ok=True)
    summary = {variant: statistics.median(ms[4:]) for variant, ms in results.items()}
    record = {"args": vars(args), "ms_per_copy": results, "median_ms": summary}
    record["machine"] = machine_facts()
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
