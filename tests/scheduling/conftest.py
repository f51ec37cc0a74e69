"""Fixtures of the batcher's tests (tests/scheduling/batcher_helpers.py holds the fakes)."""

from __future__ import annotations

import time

import pytest

from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.settings import BatchingSettings
from tests.scheduling.batcher_helpers import GatedEngine, OverlapEngine


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def make_batcher():
    batchers: list[ContinuousBatcher] = []

    def make(engine, *, metrics=None, clock=time.monotonic, **fields) -> ContinuousBatcher:
        """A started batcher over ``engine`` with the batching settings ``fields``."""
        config = BatchingSettings(
            # encoder calls in line (the engine thread) unless a test asks for the encoder thread
            encoder_overlap=fields.pop("encoder_overlap", isinstance(engine, OverlapEngine)),
            # an idle engine admits at once unless a test asks for the idle wait
            admission_idle_wait_ms=fields.pop("admission_idle_wait_ms", 0.0),
            **fields,
        )
        batcher = ContinuousBatcher(engine, config, metrics=metrics, clock=clock)
        batcher.start()
        batchers.append(batcher)
        return batcher

    yield make
    for batcher in batchers:
        if isinstance(batcher.engine, GatedEngine):
            batcher.engine.allow(10**6)
        batcher.close()
