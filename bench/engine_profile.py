"""Where our engine's time goes on the real workload: graph calls, ops, and the host between.

    .venv/bin/python bench/engine_profile.py --export build/onnx/default [--batch 32] \\
        [--beam 1] [--threads 1] [--sentences 256] [--workload strings]

Translates the held-out sample of bench/real_peers.py (length-sorted batches, natural end)
with ONNX Runtime's profiler on both sessions, then reports:

- wall time split into encoder calls, decoder calls and the host (Python and numpy in
  service/runtime/ between the calls: the wall time the sessions' ``run`` did not take);
- per session, the share of each op type in the kernels' time, and the time of one call
  outside its kernels (ORT's per-call overhead: feeds, fetches, allocation);
- the ops ONNX Runtime runs after its graph optimizations (fusions show here: Attention,
  SkipLayerNormalization, FusedMatMul, MatMulInteger ...);
- the Python functions that take the most time outside the calls (cProfile, ``--python``).

Profiling adds overhead to every kernel: read the shares, not the absolute times.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.real_peers import batches, heldout_texts, sample, source_ids  # noqa: E402


def profiled_engine(export: Path, threads: int, profile: bool):
    """An engine whose sessions run ORT's profiler (``profile``), with their ``run`` timed."""
    from service.runtime import onnx_model
    from service.runtime.engine import Engine

    original = onnx_model._session_options

    def options(intra_op_threads: int, spinning: bool):
        made = original(intra_op_threads, spinning)
        made.enable_profiling = profile
        return made

    onnx_model._session_options = options
    try:
        engine = Engine.from_dir(export, provider="cpu", intra_op_threads=threads)
    finally:
        onnx_model._session_options = original
    timers: dict[str, list[float]] = {"encoder": [], "decoder": []}
    for name in timers:
        session = getattr(engine.model, name)
        engine.model.__dict__[name] = TimedSession(session, timers[name])
    return engine, timers


class TimedSession:
    """An InferenceSession whose ``run`` calls are timed into a list."""

    def __init__(self, session: Any, seconds: list[float]) -> None:
        self.session, self.seconds = session, seconds

    def run(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.session.run(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def op_shares(profile_file: str) -> dict[str, Any]:
    """Kernel time by op type (and by node for the top nodes) from ORT's profile JSON."""
    events = json.loads(Path(profile_file).read_text())
    by_op: collections.Counter[str] = collections.Counter()
    by_node: collections.Counter[str] = collections.Counter()
    calls, call_us = 0, 0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            by_op[op] += event["dur"]
            by_node[event["name"][: -len("_kernel_time")]] += event["dur"]
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            calls += 1
            call_us += event["dur"]
    kernels = sum(by_op.values())
    return {
        "calls": calls,
        "us_per_call": round(call_us / max(1, calls), 1),
        "kernel_us_per_call": round(kernels / max(1, calls), 1),
        "outside_kernels_share": round(1 - kernels / max(1, call_us), 3),
        "op_share": {op: round(us / max(1, kernels), 3) for op, us in by_op.most_common(15)},
        "top_nodes": {n: round(us / max(1, kernels), 3) for n, us in by_node.most_common(12)},
    }


def optimized_ops(path: Path, threads: int) -> dict[str, int]:
    """Op types of ``path`` after ORT's graph optimizations (ORT_ENABLE_ALL)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as directory:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.optimized_model_filepath = str(Path(directory) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return dict(collections.Counter(node.op_type for node in model.graph.node).most_common())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True, type=Path)
    parser.add_argument("--workload", default="strings")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--python", action="store_true", help="cProfile the host side")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    config = json.loads((args.export / "config.json").read_text())
    texts = sample(heldout_texts(config.get("source_lang", "en"), args.workload), args.sentences)
    sources = source_ids(args.export, texts)
    plan = batches(sources, args.batch)
    report: dict[str, Any] = {"export": str(args.export), "batch": args.batch, "beam": args.beam}

    def translate(engine: Any) -> float:
        started = time.perf_counter()
        for batch in plan:
            engine.translate_ids([sources[i] for i in batch], beam_size=args.beam)
        return time.perf_counter() - started

    # Unprofiled first: the time split without the profiler's overhead.
    engine, timers = profiled_engine(args.export, args.threads, profile=False)
    engine.warmup()
    translate(engine)
    for seconds in timers.values():
        seconds.clear()
    if args.python:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    wall = translate(engine)
    if args.python:
        profiler.disable()
        stats = pstats.Stats(profiler).sort_stats("tottime")
        stats.print_stats(25)
    encoder, decoder = sum(timers["encoder"]), sum(timers["decoder"])
    report["split"] = {
        "wall_s": round(wall, 3),
        "sentences_per_s": round(len(sources) / wall, 1),
        "encoder_share": round(encoder / wall, 3),
        "decoder_share": round(decoder / wall, 3),
        "host_share": round(1 - (encoder + decoder) / wall, 3),
        "encoder_calls": len(timers["encoder"]),
        "decoder_calls": len(timers["decoder"]),
        "us_per_decoder_call": round(1e6 * decoder / max(1, len(timers["decoder"])), 1),
        "host_us_per_decoder_call": round(
            1e6 * (wall - encoder - decoder) / max(1, len(timers["decoder"])), 1
        ),
    }
    profiled, _ = profiled_engine(args.export, args.threads, profile=True)
    translate(profiled)
    for name in ("encoder", "decoder"):
        session = getattr(profiled.model, name)
        report[name] = op_shares(session.end_profiling())
        report[name]["optimized_ops"] = optimized_ops(args.export / f"{name}.onnx", args.threads)
    for leftover in Path.cwd().glob("onnxruntime_profile_*.json"):
        leftover.unlink()
    text = json.dumps(report, indent=1)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
