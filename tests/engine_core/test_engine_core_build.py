"""One engine core, built one way: the one-process service (service/wiring.py) and an
engine-core process (service/processes/engine_process.py) build it from the same settings
through service/engine_core/core.py, so they hold the same queue, limits, calibration and
metrics."""

from __future__ import annotations

import pytest

from service.config import Settings
from service.engine_core.core import TEXTS_AT_ONCE, EngineCore
from service.metrics import ServiceMetrics
from service.processes.engine_process import load_server
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.settings import SHORTEST_SENTENCE_CHARS
from service.translation.exports import ModelSpec
from service.wiring import engine_loader, model_loader
from tests.service_fixtures import tiny_model

MODEL_ID = "tiny"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def model_series(metrics: ServiceMetrics) -> dict[tuple[str, str], float]:
    """The samples of the model's own series (labelled with its id), by name and label."""
    return {
        (sample.name, key): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        for key, value in sample.labels.items()
        if value == MODEL_ID
    }


def both_ways(settings: Settings, model_dir, tmp_path, cpus: int) -> tuple[EngineCore, ...]:
    """The engine core as the one-process service builds it, and as an engine-core process
    given ``cpus`` as its share builds it."""
    spec = ModelSpec(MODEL_ID, model_dir, "en", "de")
    in_process_metrics = ServiceMetrics()
    loaded = model_loader(settings, in_process_metrics, engine_loader(settings), None)(spec)
    assert isinstance(loaded.batcher, ContinuousBatcher)  # a loaded model holds no engine
    assert loaded.info == EngineCore(MODEL_ID, loaded.batcher.engine, loaded.batcher).info
    in_process = EngineCore(MODEL_ID, loaded.batcher.engine, loaded.batcher)
    server = load_server(settings, MODEL_ID, model_dir, f"ipc://{tmp_path}/core.sock", cpus)
    in_own_process = EngineCore(MODEL_ID, server.batcher.engine, server.batcher)
    assert server.info == in_own_process.info
    return in_process, in_own_process


def test_both_process_modes_build_the_same_engine_core_from_the_same_settings(
    model_dir, tmp_path, monkeypatch
):
    from service import wiring

    monkeypatch.setattr(wiring, "cpu_budget", lambda: _budget(2))
    settings = Settings(
        provider="cpu", intra_op_threads=1, max_chars_per_text=4500, admission_cost_aware=True
    )
    in_process, in_own_process = both_ways(settings, model_dir, tmp_path, cpus=2)
    for core in (in_process, in_own_process):
        # pastes of the character limit in their shortest sentences fit an idle queue
        assert core.batcher.max_queue == TEXTS_AT_ONCE * 4500 // SHORTEST_SENTENCE_CHARS
        assert core.engine.step_cost.fitted and core.engine.encode_cost.fitted  # calibrated
        assert core.batcher._loop.overlap is not None  # a spare core: the encoder thread
    assert in_process.info == in_own_process.info
    assert in_process.batcher.config == in_own_process.batcher.config
    assert in_process.batcher.max_batch_rows == in_own_process.batcher.max_batch_rows
    assert in_process.batcher.idle_wait_s == in_own_process.batcher.idle_wait_s
    assert model_series(in_process.batcher.metrics) == model_series(in_own_process.batcher.metrics)
    assert model_series(in_process.batcher.metrics)  # the model's gauges are there to compare


def test_a_replica_without_a_spare_core_in_its_share_runs_the_encoder_in_line(model_dir, tmp_path):
    """The encoder thread follows the replica's own share of the CPUs, not the machine's."""
    settings = Settings(provider="cpu", intra_op_threads=1, admission_cost_aware=False)
    server = load_server(settings, MODEL_ID, model_dir, f"ipc://{tmp_path}/core.sock", cpus=1)
    assert server.batcher._loop.overlap is None
    assert not server.batcher.engine.step_cost.fitted  # cost-blind admission: no calibration


def _budget(cpus: int):
    from service.cpus import CpuBudget

    return CpuBudget(cpus, cpus, None, "affinity")
