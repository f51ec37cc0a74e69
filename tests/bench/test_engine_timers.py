"""bench/engine_timers.py times the engine thread's calls, ONNX Runtime's apart."""

from __future__ import annotations

import threading
import time

from bench.engine_timers import ENGINE_THREAD, EngineTimers, summary


def spin(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


class Session:
    def run(self) -> None:
        spin(0.02)


class Engine:
    def step(self, session: Session) -> None:
        spin(0.01)
        session.run()


def test_only_the_engine_thread_is_timed_and_onnx_runtime_is_kept_apart():
    original_step, original_run = Engine.step, Session.run
    timers = EngineTimers()
    timers._wrap(Session, "run", None)
    timers._wrap(Engine, "step", "Engine.step")
    timers.start()
    engine = threading.Thread(target=lambda: Engine().step(Session()), name=ENGINE_THREAD)
    engine.start()
    engine.join()
    Engine().step(Session())  # another thread's call: not counted
    report = timers.stop()
    step = report["functions"]["Engine.step"]
    assert step["calls"] == 1
    assert 0.02 <= report["onnx_runtime_s"] < 0.03
    assert step["onnx_runtime_s"] == report["onnx_runtime_s"]  # the run inside the step
    assert 0.03 <= step["cpu_s"] < 0.045
    assert (Engine.step, Session.run) == (original_step, original_run)  # restored
    line = summary(report, requests=10)
    assert "ONNX Runtime 2." in line and "Engine.step 1." in line  # ms a request, host apart
