"""Where a decoder step of our engine goes: the decoder call, the encoder, the host (Python).

    .venv/bin/python bench/step_split.py EXPORT_DIR [--cells 1x1,4x32] [--threads 2]
    .venv/bin/python bench/step_split.py bench/work/base/ours      # after bench/peers.py --size base

For each cell (beam x batch) it translates ``--batch`` random sources of 24 ids with
``Engine.translate_ids`` (one untimed warm-up of 16 tokens, then ``--repeats`` timed runs of
``--new-tokens``) and splits the wall time per decoder step into the decoder's
``session.run``, the encoder's (its one call per run, spread over the steps) and everything
else (the engine's Python: step inputs, the searches, cache reordering).

``--constrained`` decodes every sentence under the placeholder constraint the service puts on
every sentence of a model whose vocabulary has symbols (each symbol id with its count in the
source, here 0): the searches' per-row bookkeeping as served, not just bare greedy and beam.

On the device cache path (CUDA, or ``--kv-backend device`` on the CPU) the helper graphs'
calls (``kv_select``, ``kv_merge``, ``kv_append``) are timed too: ``host`` includes them, as it
always did, and ``helpers`` says how much of it they are; ``calls per step`` counts the
decoder's and the helpers' session calls (1.0: the device decoder alone,
export/device_decoder.py; an export without it appends with ``kv_append``: 2 or more).

``--floor`` also times the "weights only" lower bound: a graph of nothing but the decoder's
weight MatMuls (same shapes, chained; random values) at 1 and 128 rows, i.e. what streaming
(1 row) or multiplying (128 rows) the decoder's weights costs on this machine with ONNX
Runtime, without attention, caches, norms or the search head.

Run it under the exclusive CPU lock; figures in docs/engine.md and BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.runtime.engine import Engine  # noqa: E402


class TimedSession:
    """An InferenceSession whose ``run`` and ``run_with_iobinding`` calls are timed (everything
    else passes through). On CUDA a bound run returns once its outputs are synchronised, so its
    time is the device's work plus ONNX Runtime's launches and copies."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.seconds = 0.0
        self.calls = 0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.session.run(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1

    def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.session.run_with_iobinding(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def random_sources(vocab_size: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``length - 1`` ordinary ids (above the first few specials) and eos (0 in Marian)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(4, vocab_size - 1, length - 1).tolist() + [0] for _ in range(count)]


HELPERS = ("kv_select", "kv_merge", "kv_append")  # DeviceKV's helper-graph sessions


def split_cell(
    engine: Engine,
    sources: list[list[int]],
    beam: int,
    new_tokens: int,
    repeats: int,
    copy_tokens: list[dict[int, int] | None] | None = None,
) -> dict[str, float]:
    decoder = engine.model.decoder = TimedSession(engine.model.decoder)
    encoder = engine.model.encoder = TimedSession(engine.model.encoder)
    kv = engine.model.kv
    helpers = {
        name: TimedSession(getattr(kv, name))
        for name in HELPERS
        if getattr(kv, name, None) is not None
    }
    for name, helper in helpers.items():
        setattr(kv, name, helper)
    engine.translate_ids(sources, beam_size=beam, max_new_tokens=16, copy_tokens=copy_tokens)
    runs = []
    for _ in range(repeats):
        for session in (decoder, encoder, *helpers.values()):
            session.seconds, session.calls = 0.0, 0
        started = time.perf_counter()
        engine.translate_ids(
            sources, beam_size=beam, max_new_tokens=new_tokens, copy_tokens=copy_tokens
        )
        wall = time.perf_counter() - started
        steps = decoder.calls
        helper_seconds = sum(helper.seconds for helper in helpers.values())
        runs.append(
            {
                "step_ms": 1e3 * wall / steps,
                "decoder_ms": 1e3 * decoder.seconds / steps,
                "encoder_ms": 1e3 * encoder.seconds / steps,
                "host_ms": 1e3 * (wall - decoder.seconds - encoder.seconds) / steps,
                "helpers_ms": 1e3 * helper_seconds / steps,
                # session calls per step besides the encoder's: 1 is the device decoder alone
                "calls_per_step": (steps + sum(h.calls for h in helpers.values())) / steps,
            }
        )
    engine.model.decoder, engine.model.encoder = decoder.session, encoder.session
    for name, helper in helpers.items():
        setattr(kv, name, helper.session)
    return {key: round(statistics.median(run[key] for run in runs), 3) for key in runs[0]}


def matmul_floor(model_dir: Path, threads: int) -> dict[int, float]:
    """Median ms of the weights-only graph (module docstring) at 1 and 128 rows."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    config = json.loads((model_dir / "config.json").read_text())
    model = config["model"]
    d, ffn, vocab = model["d_model"], model["decoder_ffn_dim"], config["vocab_size"]
    # per layer: self q, k, v, out; cross q, out (cross K/V come from the encoder); fc1, fc2
    shapes = [(d, d)] * 6 + [(d, ffn), (ffn, d)]
    shapes = shapes * config["num_layers"] + [(d, vocab)]
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for index, shape in enumerate(shapes):
        weight = (rng.standard_normal(shape) * 0.01).astype(np.float32)
        weights.append(numpy_helper.from_array(weight, f"w{index}"))
        nodes.append(helper.make_node("MatMul", [current, f"w{index}"], [f"y{index}"]))
        current = f"y{index}"
    graph = helper.make_graph(
        nodes,
        "weights_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", d])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["rows", vocab])],
        initializer=weights,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    floor = {}
    for rows in (1, 128):
        x = rng.standard_normal((rows, d)).astype(np.float32)
        for _ in range(3):
            session.run(None, {"x": x})
        times = []
        for _ in range(30 if rows == 1 else 10):
            started = time.perf_counter()
            session.run(None, {"x": x})
            times.append(time.perf_counter() - started)
        floor[rows] = round(1e3 * statistics.median(times), 2)
    return floor


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="an export dir (python -m export)")
    parser.add_argument("--cells", default="1x1,4x32", help="BEAMxBATCH, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--floor", action="store_true", help="also time the weights-only graph")
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--kv-backend",
        choices=("host", "device"),
        help="where the caches live (default: host on cpu, device on cuda)",
    )
    parser.add_argument("--json", type=Path, help="also write the splits here")
    parser.add_argument(
        "--constrained", action="store_true", help="the service's placeholder constraint on"
    )
    args = parser.parse_args(argv)

    engine = Engine.from_dir(
        args.model_dir,
        provider=args.provider,
        intra_op_threads=args.threads,
        kv_backend=args.kv_backend,
    )
    if engine.provider != args.provider:
        raise SystemExit(f"asked for {args.provider}, the engine runs on {engine.provider}")
    splits = {}
    cells = [tuple(int(part) for part in cell.split("x")) for cell in args.cells.split(",")]
    sources = random_sources(engine.model.info.vocab_size, max(b for _, b in cells), 24)
    copy_tokens = None
    if args.constrained:
        from service.text.pipeline import copy_tokens_for
        from service.text.protection import placeholder_token_ids
        from service.text.tokenizer import Tokenizer

        symbol_ids = placeholder_token_ids(Tokenizer.from_dir(args.model_dir))
        copy_tokens = [copy_tokens_for(source, symbol_ids) for source in sources]
    for beam, batch in cells:
        constraints = copy_tokens[:batch] if copy_tokens is not None else None
        split = split_cell(
            engine, sources[:batch], beam, args.new_tokens, args.repeats, constraints
        )
        splits[f"{beam}x{batch}"] = split
        print(
            f"beam {beam} x {batch}: {split['step_ms']:.2f} ms/step = decoder "
            f"{split['decoder_ms']:.2f} + encoder {split['encoder_ms']:.2f} + host "
            f"{split['host_ms']:.2f} (helper graphs {split['helpers_ms']:.2f}); "
            f"{split['calls_per_step']:.2f} session calls per step"
        )
    if args.floor:
        floor = matmul_floor(args.model_dir, args.threads)
        print(f"weights-only MatMul graph: {floor[1]:.2f} ms at 1 row, {floor[128]:.2f} at 128")
    if args.json:
        facts = {
            "provider": args.provider,
            "kv_backend": engine.kv.name,
            "decoder_file": engine.model.decoder_file,
            "constrained": args.constrained,
            "cells": splits,
        }
        args.json.write_text(json.dumps(facts, indent=2))


if __name__ == "__main__":
    main()
