"""The batcher's configuration: the fakes' interface, the batching policy, and the settings
that make the batching config and the engine's thread count."""

from __future__ import annotations

import pytest

from service.scheduling.batcher import ContinuousBatcher
from tests.scheduling.batcher_helpers import FakeEngine, GatedEngine, OverlapEngine


def test_the_fakes_offer_every_method_the_batcher_calls():
    from service.scheduling.batcher import DecodeEngine

    for fake in (FakeEngine(), GatedEngine(), OverlapEngine()):
        assert isinstance(fake, DecodeEngine), type(fake).__name__


def test_unknown_batching_policy_is_refused():
    with pytest.raises(ValueError, match="batching policy"):
        ContinuousBatcher(FakeEngine(), batching="eager", static_max_wait_s=0.0)  # type: ignore[arg-type]


def test_batching_config_comes_from_settings_in_one_place():
    from service.config import Settings
    from service.wiring import batching_config

    settings = Settings(admission_max_stall_steps=3, max_batch_rows=7, admission_cost_aware=False)
    config = batching_config(settings)
    batcher = ContinuousBatcher(FakeEngine(), config)
    assert batcher.config == config
    assert (config.max_stall_steps, batcher.max_batch_rows, config.cost_aware) == (3, 7, False)


@pytest.mark.parametrize(
    ("cpus", "idle_wait_ms", "expected_s"),
    [(1, None, 0.010), (2, None, 0.0), (2, 5.0, 0.005), (1, 0.0, 0.0)],
)
def test_an_idle_engine_waits_for_company_only_where_the_encoder_runs_in_line(
    monkeypatch, cpus, idle_wait_ms, expected_s
):
    """On one CPU a newcomer arriving just after an admission rarely joins it, so an idle
    engine waits as long as static batching would; with an encoder thread it does not."""
    from service import wiring
    from service.config import Settings
    from service.cpus import CpuBudget

    monkeypatch.setattr(wiring, "cpu_budget", lambda: CpuBudget(cpus, cpus, None, "affinity"))
    settings = Settings(static_max_wait_ms=10.0, admission_idle_wait_ms=idle_wait_ms)
    config = wiring.batching_config(settings)
    assert config.encoder_overlap == (cpus >= 2)
    assert config.idle_wait_s == pytest.approx(expected_s)


def test_engine_threads_leave_the_event_loop_a_core_unless_set(monkeypatch):
    import os

    from service.config import Settings

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert Settings().engine_threads() == 3
    assert Settings(intra_op_threads=4).engine_threads() == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert Settings().engine_threads() == 1  # never 0: that would be ONNX Runtime's own choice
