"""The batcher's configuration: the fakes' interface, the batching policy, and the settings
that make the batching config and the engine's thread count."""

from __future__ import annotations

import pytest

from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.settings import BatchingSettings
from tests.scheduling.batcher_helpers import FakeEngine, GatedEngine, OverlapEngine


def test_the_fakes_offer_every_method_the_batcher_calls():
    from service.scheduling.batcher import DecodeEngine

    for fake in (FakeEngine(), GatedEngine(), OverlapEngine()):
        assert isinstance(fake, DecodeEngine), type(fake).__name__


def test_unknown_batching_policy_is_refused():
    with pytest.raises(ValueError, match="batching"):
        BatchingSettings(batching="eager")


def test_the_batcher_takes_the_settings_batching_group_as_it_is():
    from service.config import Settings

    settings = Settings(max_batch_rows=7, admission_cost_aware=False)
    batcher = ContinuousBatcher(FakeEngine(), settings.scheduling)
    assert batcher.config is settings.scheduling
    assert (batcher.max_batch_rows, batcher.config.admission_cost_aware) == (7, False)


@pytest.mark.parametrize(
    ("cpus", "idle_wait_ms", "expected_s"),
    [(1, None, 0.010), (2, None, 0.0), (2, 5.0, 0.005), (1, 0.0, 0.0)],
)
def test_an_idle_engine_waits_for_company_only_where_the_encoder_runs_in_line(
    cpus, idle_wait_ms, expected_s
):
    """On one CPU a newcomer arriving just after an admission rarely joins it, so an idle
    engine waits as long as static batching would; with an encoder thread it does not."""
    from service.config import Settings
    from service.cpus import spare_core

    settings = Settings(static_max_wait_ms=10.0, admission_idle_wait_ms=idle_wait_ms)
    batcher = ContinuousBatcher(FakeEngine(), settings.scheduling, spare_core=spare_core(cpus))
    assert (batcher._loop.overlap is not None) == (cpus >= 2)
    assert batcher.idle_wait_s == pytest.approx(expected_s)


def test_engine_threads_leave_the_event_loop_a_core_unless_set(monkeypatch):
    import os

    from service.config import Settings

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert Settings().model.engine_threads == 3
    assert Settings(intra_op_threads=4).model.engine_threads == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert Settings().model.engine_threads == 1  # never 0: that would be ONNX Runtime's own choice
