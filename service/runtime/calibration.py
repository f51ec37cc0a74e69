"""Start-up calibration: time decoder and encoder calls over a spread of shapes, so the
batcher knows this machine's costs (where the knee lies, what an admission's encoder call
costs) before traffic arrives. Live calls refine both fits afterwards."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import numpy as np

from service.runtime.model_io import ModelInfo, StepInputs
from service.runtime.onnx_model import OnnxSeq2Seq
from service.runtime.step_cost import CallCostModel, StepCostModel, StepShape, encode_features

log = logging.getLogger(__name__)


def ordinary_source(info: ModelInfo, length: int) -> list[int]:
    """``length`` ids of ordinary tokens ending in eos (no pad, unk or start token)."""
    special = {info.pad_id, info.eos_id, info.decoder_start_id, info.unk_id}
    ordinary = [token for token in range(1, info.vocab_size) if token not in special]
    return [ordinary[i % len(ordinary)] for i in range(length - 1)] + [info.eos_id]


def calibrate(
    model: OnnxSeq2Seq,
    step_cost: StepCostModel,
    encode_cost: CallCostModel,
    rows: Iterable[int] = (1, 4, 8, 16, 32, 64),
    widths: Iterable[int] = (8, 32),
    past_lens: Iterable[int] = (0, 16),
    repeats: int = 2,
) -> float:
    """Time calls on random caches (nothing joins a batch) and fit both models; returns
    seconds spent."""
    info, kv = model.info, model.kv
    started = time.perf_counter()
    samples: list[tuple[StepShape, float]] = []
    rng = np.random.default_rng(0)
    for width in widths:
        src = np.array(ordinary_source(info, width))
        for count in rows:
            input_ids = np.tile(src, (count, 1))
            mask = np.ones_like(input_ids)
            tick, cpu_tick = time.perf_counter(), time.thread_time()
            cross = kv.encode(input_ids, mask)
            tokens_in = count * width
            encode_cost.observe(
                encode_features(1, tokens_in, tokens_in * width),
                time.perf_counter() - tick,
                time.thread_time() - cpu_tick,
            )
            for past_len in past_lens:
                past = kv.empty(count)
                tokens = np.full((count, 1), info.decoder_start_id, dtype=np.int64)
                # grow the cache to past_len with real decoder calls (untimed)
                for position in range(past_len + repeats):
                    # two ban columns, as the engine's pad and unk
                    inputs = StepInputs.lockstep(
                        tokens, position, mask, top_k=8, pad_id=info.pad_id, bans=2
                    )
                    tick = time.perf_counter()
                    head, past = kv.decode(inputs, past, cross)
                    if position >= past_len:
                        samples.append(
                            (StepShape(count, position, width), time.perf_counter() - tick)
                        )
                    tokens = rng.choice(head.top_ids[:, :4].reshape(-1), (count, 1))
    step_cost.calibrate(samples)
    elapsed = time.perf_counter() - started
    log.info(
        "costs calibrated in %.2f s over %d decoder calls: step %s, encoder %s",
        elapsed,
        len(samples),
        [round(c, 6) for c in step_cost.coefficients],
        [round(c, 6) for c in encode_cost.coefficients],
    )
    return elapsed
