"""Where the engine's time goes: the engine thread's wall seconds by phase, and every serving
thread's CPU and run-queue seconds from the kernel.

``PhaseClock`` splits the engine thread's wall time between two boundaries into phases:

    idle        waiting for work (nothing queued, running or encoding)
    wait        waiting on purpose: a policy's coalescing window, or an overlapped encoder call
    turn        waiting for this model's turn on a device shared with other models
    schedule    choosing who joins (policy, admitter, latency budget)
    encode      newcomers' encoder calls in line (no spare core)
    place       merging encoded newcomers into the running groups
    decoder     decoder calls (ONNX Runtime, with the KV helper calls of the cache backend)
    step_host   the rest of a step: step inputs, search, cache rearrangement
    update      delivering finished sentences

``ThreadSched`` (service/metrics.py) reads ``/proc/self/task/<tid>/schedstat`` of the threads registered with it
(the engine thread, the encoder thread, the event loop) when ``/metrics`` is scraped: CPU
seconds, and seconds spent runnable but waiting for a core (run-queue delay). A thread's wall
time minus both is time it did not want a core: waiting for the GIL, a lock or I/O. So on one
core a run tells whether paragraph rows are slow because the engine thread computes (decoder,
step_host), stalls them for admissions (encode, place) or waits for a core the event loop holds
(run-queue delay) — docs/engine.md has a worked example.

Reading the file costs tens of microseconds, so it happens on the scraping thread, never per
step; the phases cost two ``perf_counter`` calls each.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter

PHASES = (
    "idle",
    "wait",
    "turn",
    "schedule",
    "encode",
    "place",
    "decoder",
    "step_host",
    "update",
)


class PhaseClock:
    """Wall seconds of the engine thread by phase (``mt_engine_phase_seconds``)."""

    def __init__(self, counter: Counter) -> None:
        self._children = {phase: counter.labels(phase=phase) for phase in PHASES}

    def add(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            self._children[phase].inc(seconds)

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - started)
