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
step; the phases cost two ``perf_counter`` calls each. The engine loop and its scheduler time
their work only through a ``PhaseClock`` (and ``thread_cpu``), so no timing lines run through
their logic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

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


@dataclass
class Lap:
    """The wall seconds of one phase's body, once it has run."""

    seconds: float = 0.0


class PhaseClock:
    """Wall seconds of the engine thread by phase (``mt_engine_phase_seconds``), and the
    seconds it holds its turn working (``busy``: ``mt_engine_busy_seconds``).

    A phase opened inside another is charged alone: the outer one gets its own seconds less
    those of the phases within it. A phase whose body raises is charged nowhere (its work
    failed; the error counters count it). Engine thread only."""

    def __init__(self, counter: Counter, busy: Counter | None = None) -> None:
        self._children = {phase: counter.labels(phase=phase) for phase in PHASES}
        self._busy = busy
        self._depth = 0  # phases open now
        self._inner_s = 0.0  # seconds charged within the innermost open phase

    def add(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            self._children[phase].inc(seconds)
            if self._depth:
                self._inner_s += seconds

    @contextmanager
    def phase(self, phase: str) -> Iterator[Lap]:
        lap = Lap()
        outer_inner_s, self._inner_s = self._inner_s, 0.0
        self._depth += 1
        started = time.perf_counter()
        ran = False
        try:
            yield lap
            ran = True
        finally:
            lap.seconds = time.perf_counter() - started
            own_s = lap.seconds - self._inner_s
            self._depth -= 1
            self._inner_s = outer_inner_s + lap.seconds if self._depth else 0.0
            if ran and own_s > 0:
                self._children[phase].inc(own_s)

    @contextmanager
    def turn(self, turn: AbstractContextManager[object]) -> Iterator[None]:
        """Wait for ``turn`` (the "turn" phase: other models' steps on a shared device), then
        count the body's wall seconds as busy."""
        asked = time.perf_counter()
        with turn:
            started = time.perf_counter()
            self.add("turn", started - asked)
            yield
            if self._busy is not None:
                self._busy.inc(time.perf_counter() - started)

    @contextmanager
    def decoder_step(self, decoder_seconds: Callable[[], float]) -> Iterator[None]:
        """One decoder step: the seconds the engine spent inside decoder calls
        (``decoder_seconds()``, its running total) are "decoder", the rest "step_host"."""
        before = decoder_seconds()
        with self.phase("step_host"):
            yield
            self.add("decoder", decoder_seconds() - before)


@contextmanager
def thread_cpu(counter: Counter) -> Iterator[None]:
    """Add the calling thread's CPU seconds in the body to ``counter``: CPU, not wall, where
    the event loop may take the core midway (on one core)."""
    started = time.thread_time()
    yield
    counter.inc(time.thread_time() - started)
