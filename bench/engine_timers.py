"""The served engine thread's CPU split between ONNX Runtime and its own Python, by function.

A sampler finds where a thread's time goes by its stacks; here the engine thread's CPU clock is
read around the calls themselves (``time.thread_time``, a few hundred nanoseconds a read): every
``InferenceSession.run`` it makes, and the engine's functions that do host work between two
calls (scheduling, the searches, cache copies as rows leave and join, the step inputs). Each
function's figure is inclusive, with the ONNX Runtime time inside it apart: ``advance`` holds
``select``, ``encode`` holds the encoder's calls and the merges of a length class.

    timers = EngineTimers(); timers.patch(); timers.start(); ...; report = timers.stop()

Only the thread named ``ENGINE_THREAD`` (the batcher's) is timed; another thread's calls (a
calibration at start-up, a worker) pass through untouched.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

ENGINE_THREAD = "engine-loop"
# (module, class, method): the engine's host work between two ONNX Runtime calls
TIMED = (
    ("service.scheduling.scheduler", "Scheduler", "schedule"),
    ("service.runtime.engine", "Engine", "encode"),
    ("service.runtime.engine", "Engine", "place"),
    ("service.runtime.engine", "Engine", "step"),
    ("service.runtime.groups", "Group", "step_inputs"),
    ("service.runtime.groups", "Group", "advance"),
    ("service.runtime.groups", "Group", "rearrange"),
    ("service.runtime.host_kv", "HostKV", "decode"),
    ("service.runtime.host_kv", "HostKV", "select"),
    ("service.runtime.host_kv", "HostKV", "merge"),
)


class EngineTimers:
    """CPU seconds of the engine thread, of its ONNX Runtime calls and of ``TIMED``."""

    def __init__(self) -> None:
        self.onnx_runtime_s = 0.0
        self.cpu_s: dict[str, float] = defaultdict(float)
        self.inner_onnx_runtime_s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._on = False
        self._restore: list[tuple[Any, str, Any]] = []
        self._clock: int | None = None
        self._thread_started = 0.0

    def patch(self) -> None:
        import importlib

        import onnxruntime

        self._wrap(onnxruntime.InferenceSession, "run", None)
        for module_name, class_name, method in TIMED:
            try:
                owner = getattr(importlib.import_module(module_name), class_name)
                getattr(owner, method)
            except (ImportError, AttributeError):  # a checkout without it
                continue
            self._wrap(owner, method, f"{class_name}.{method}")

    def _wrap(self, owner: Any, method: str, name: str | None) -> None:
        original: Callable[..., Any] = getattr(owner, method)
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not timers._on or threading.current_thread().name != ENGINE_THREAD:
                return original(*args, **kwargs)
            started, inner_started = time.thread_time(), timers.onnx_runtime_s
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                if name is None:
                    timers.onnx_runtime_s += spent
                else:
                    timers.cpu_s[name] += spent
                    timers.inner_onnx_runtime_s[name] += timers.onnx_runtime_s - inner_started
                    timers.calls[name] += 1

        self._restore.append((owner, method, original))
        setattr(owner, method, timed)

    def start(self) -> None:
        engine = next((t for t in threading.enumerate() if t.name == ENGINE_THREAD), None)
        if engine is not None and engine.ident is not None:
            self._clock = time.pthread_getcpuclockid(engine.ident)
            self._thread_started = time.clock_gettime(self._clock)
        self._on = True

    def stop(self) -> dict[str, Any]:
        self._on = False
        thread_cpu_s = (
            time.clock_gettime(self._clock) - self._thread_started
            if self._clock is not None
            else None
        )
        for owner, method, original in reversed(self._restore):
            setattr(owner, method, original)
        self._restore.clear()
        return {
            "thread_cpu_s": thread_cpu_s,
            "onnx_runtime_s": self.onnx_runtime_s,
            "functions": {
                name: {
                    "cpu_s": self.cpu_s[name],
                    "onnx_runtime_s": self.inner_onnx_runtime_s[name],
                    "calls": self.calls[name],
                }
                for name in self.cpu_s
            },
        }


def summary(report: dict[str, Any], requests: int) -> str:
    """One line: the engine thread's ms a request, ONNX Runtime's, and each function's host
    (its own CPU less the ONNX Runtime calls inside it)."""
    per = 1000 / max(requests, 1)
    total, onnx = report.get("thread_cpu_s"), report["onnx_runtime_s"]
    head = f"engine thread {total * per:.2f} ms/req" if total is not None else "engine thread"
    parts = [f"ONNX Runtime {onnx * per:.2f}"]
    if total is not None:
        parts.append(f"Python and numpy {(total - onnx) * per:.2f}")
    host = [
        f"{name} {(f['cpu_s'] - f['onnx_runtime_s']) * per:.2f}"
        for name, f in sorted(report["functions"].items())
    ]
    return f"{head}: {', '.join(parts)}; host by function (inclusive): {', '.join(host)}"
