"""Driving an engine nobody else drives (scripts, warm-up, tests): add sentences, step until
they finish, return their tokens in input order. The batcher (service/scheduling/) drives the
served engine step by step instead."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable
from typing import Protocol

from service.runtime import calibration
from service.runtime.onnx_model import OnnxSeq2Seq
from service.runtime.types import DecodeRequest, FinishedRequest, RejectedRequest

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What driving an engine to the end uses of it (service/runtime/engine.py's ``Engine``)."""

    model: OnnxSeq2Seq
    steps: int

    @property
    def provider(self) -> str: ...

    def add(self, requests: list[DecodeRequest]) -> list[RejectedRequest]: ...

    def drop(self, request_ids: Iterable[Hashable]) -> None: ...

    def step(self) -> list[FinishedRequest]: ...


def translate_ids(
    engine: Engine,
    src_ids: list[list[int]],
    beam_size: int = 1,
    max_new_tokens: int = 128,
    length_penalty: float = 1.0,
    copy_tokens: list[dict[int, int] | None] | None = None,
) -> list[list[int]]:
    """``src_ids`` decoded to the end, results in input order; ``copy_tokens``: per sentence,
    the placeholder constraint (see ``DecodeRequest``). Results of other requests that finish
    meanwhile are not returned to anyone."""
    ids = [("translate_ids", engine.steps, index) for index in range(len(src_ids))]
    constraints = copy_tokens if copy_tokens is not None else [None] * len(src_ids)
    requests = [
        DecodeRequest(request_id, list(src), beam_size, max_new_tokens, length_penalty, copies)
        for request_id, src, copies in zip(ids, src_ids, constraints, strict=True)
    ]
    return run_to_the_end(engine, requests)


def run_to_the_end(engine: Engine, requests: list[DecodeRequest]) -> list[list[int]]:
    """Add ``requests`` and step until they have all finished: their tokens, in order. A
    rejected request raises ``ValueError`` (and the others leave the batch)."""
    ids = [request.request_id for request in requests]
    rejected = engine.add(requests)
    if rejected:
        engine.drop(ids)
        raise ValueError(f"request {rejected[0].request_id!r}: {rejected[0].reason}")
    results: dict[Hashable, list[int]] = {}
    pending = set(ids)
    while pending:
        for done in engine.step():
            if done.request_id in pending:
                results[done.request_id] = done.tokens
                pending.discard(done.request_id)
    return [results[request_id] for request_id in ids]


def warmup(engine: Engine) -> float:
    """A tiny greedy and beam translation (allocations, kernel selection); returns seconds."""
    started = time.perf_counter()
    src = calibration.ordinary_source(engine.model.info, 4)
    translate_ids(engine, [src], beam_size=1, max_new_tokens=4)
    translate_ids(engine, [src, src[1:]], beam_size=2, max_new_tokens=4)
    elapsed = time.perf_counter() - started
    log.info("engine warmed up in %.2f s on %s", elapsed, engine.provider)
    return elapsed
