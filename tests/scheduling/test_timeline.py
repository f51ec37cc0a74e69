"""The engine's timeline: wall seconds by phase, and each serving thread's CPU and run-queue
seconds from schedstat (service/scheduling/timeline.py, service/metrics.py ``ThreadSched``)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from service.metrics import ServiceMetrics, ThreadSched, read_schedstat
from service.scheduling.timeline import PHASES, PhaseClock
from service.wiring import create_app
from tests.scheduling.batcher_helpers import SlowEngine, sentence
from tests.service_fixtures import tiny_model
from tests.web.test_api import make_settings, post, wait_ready

SCHEDSTAT = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")


def fake_proc(root: Path, threads: dict[int, tuple[int, int]]) -> Path:
    for tid, (cpu_ns, queued_ns) in threads.items():
        (root / str(tid)).mkdir(parents=True, exist_ok=True)
        (root / str(tid) / "schedstat").write_text(f"{cpu_ns} {queued_ns} 17\n")
    return root


def test_schedstat_gives_cpu_and_runqueue_seconds(tmp_path):
    proc = fake_proc(tmp_path, {41: (1_500_000_000, 250_000_000)})
    assert read_schedstat(41, proc) == (1.5, 0.25)
    assert read_schedstat(42, proc) is None  # a thread that is gone
    (proc / "41" / "schedstat").write_text("garbage\n")
    assert read_schedstat(41, proc) is None


def test_threads_of_one_role_are_summed_and_a_gone_thread_keeps_its_last_reading(tmp_path):
    proc = fake_proc(tmp_path, {1: (1_000_000_000, 0), 2: (2_000_000_000, 500_000_000)})
    sched = ThreadSched(proc)
    sched.register("engine", 1)
    sched.register("engine", 2)
    sched.register("event_loop", 3)  # never had a schedstat file: counted as zero
    assert sched.readings() == {"engine": (3.0, 0.5), "event_loop": (0.0, 0.0)}
    (proc / "2" / "schedstat").unlink()  # thread 2 exits: its seconds do not vanish
    fake_proc(proc, {1: (4_000_000_000, 100_000_000)})
    assert sched.readings()["engine"] == (6.0, 0.6)

    registry = CollectorRegistry()
    registry.register(sched)
    assert registry.get_sample_value("mt_thread_cpu_seconds_total", {"thread": "engine"}) == 6.0
    assert registry.get_sample_value(
        "mt_thread_runqueue_seconds_total", {"thread": "engine"}
    ) == pytest.approx(0.6)


@pytest.mark.skipif(not SCHEDSTAT.exists(), reason="no schedstat on this kernel")
def test_the_kernel_counts_a_busy_thread():
    sched = ThreadSched()
    sched.register("worker")
    before = sched.readings()["worker"][0]
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:
        pass
    assert sched.readings()["worker"][0] - before >= 0.04


def test_phase_clock_adds_wall_seconds_by_phase():
    counter = Counter("phase_seconds", "test", ["phase"], registry=CollectorRegistry())
    clock = PhaseClock(counter)
    with clock.phase("decoder"):
        time.sleep(0.02)
    clock.add("encode", 0.5)
    clock.add("encode", -1.0)  # clocks never run backwards into a counter
    assert counter.labels(phase="decoder")._value.get() >= 0.02
    assert counter.labels(phase="encode")._value.get() == 0.5
    with pytest.raises(KeyError):
        clock.add("lunch", 1.0)


def test_a_phase_inside_another_is_charged_alone_and_a_failed_one_nowhere():
    counter = Counter("phase_seconds", "test", ["phase"], registry=CollectorRegistry())
    busy = Counter("busy_seconds", "test", registry=CollectorRegistry())
    clock = PhaseClock(counter, busy=busy)

    def seconds(phase: str) -> float:
        return counter.labels(phase=phase)._value.get()

    with clock.phase("schedule") as scheduling, clock.phase("idle") as idling:
        time.sleep(0.03)
    assert idling.seconds >= 0.03 and scheduling.seconds >= idling.seconds
    assert seconds("idle") == pytest.approx(idling.seconds)
    assert seconds("schedule") == pytest.approx(scheduling.seconds - idling.seconds, abs=1e-9)

    with pytest.raises(RuntimeError), clock.phase("encode"):
        raise RuntimeError("the encoder call failed")
    assert seconds("encode") == 0.0

    inside_decoder = [0.0]  # the engine's running total of seconds inside decoder calls
    started = time.perf_counter()
    with clock.turn(contextlib.nullcontext()), clock.decoder_step(lambda: inside_decoder[0]):
        time.sleep(0.02)
        inside_decoder[0] += 0.015
    took = time.perf_counter() - started
    assert seconds("decoder") == 0.015
    assert 0.02 - 0.015 <= seconds("step_host") <= took - 0.015
    assert 0.02 <= busy._value.get() <= took


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_engine_threads_phases_account_for_its_steps(make_batcher):
    metrics = ServiceMetrics().for_model("m")
    engine = SlowEngine()  # 1 ms of host work per step, no decoder call
    batcher = make_batcher(engine, metrics=metrics)
    await batcher.submit([sentence(20), sentence(10)])

    def seconds(phase: str) -> float:
        return metrics.registry.get_sample_value("mt_engine_phase_seconds_total", {"phase": phase})

    assert engine.steps >= 19
    assert seconds("step_host") >= 0.001 * engine.steps
    assert seconds("decoder") == 0.0
    assert seconds("encode") > 0  # the admission ran in line
    assert metrics.registry.get_sample_value("mt_admission_stall_seconds_count") == 0  # none ran


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def test_metrics_show_the_timeline_of_a_real_translation(model_dir):
    with TestClient(create_app(make_settings(model_dir))) as client:
        wait_ready(client)
        post(client, "/v1/translate", json={"text": ["Save changes", "Delete the file"]})
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples
        }
    phases = {
        dict(labels)["phase"]: value
        for (name, labels), value in samples.items()
        if name == "mt_engine_phase_seconds_total"
    }
    assert set(phases) == set(PHASES)
    assert phases["decoder"] > 0 and phases["step_host"] > 0 and phases["encode"] > 0
    if SCHEDSTAT.exists():
        for role in ("engine", "event_loop"):
            assert samples[("mt_thread_cpu_seconds_total", (("thread", role),))] > 0, role
