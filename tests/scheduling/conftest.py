"""Fixtures of the batcher's tests (tests/scheduling/batcher_helpers.py holds the fakes)."""

from __future__ import annotations

import pytest

from service.scheduling.batcher import ContinuousBatcher
from tests.scheduling.batcher_helpers import GatedEngine, OverlapEngine


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def make_batcher():
    batchers: list[ContinuousBatcher] = []

    def make(engine, **limits) -> ContinuousBatcher:
        limits.setdefault("batching", "continuous")  # not whatever MT_BATCHING says
        # encoder calls in line (the engine thread) unless a test asks for the encoder thread
        limits.setdefault("encoder_overlap", isinstance(engine, OverlapEngine))
        # an idle engine admits at once unless a test asks for the idle wait
        limits.setdefault("admission_idle_wait_ms", 0.0)
        batcher = ContinuousBatcher(engine, **limits)
        batcher.start()
        batchers.append(batcher)
        return batcher

    yield make
    for batcher in batchers:
        if isinstance(batcher.engine, GatedEngine):
            batcher.engine.allow(10**6)
        batcher.close()
