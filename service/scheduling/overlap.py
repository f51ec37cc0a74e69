"""Encoder overlap: newcomers' encoder calls on a second thread while the running rows step.

Where a core is spare (service/cpus.py counts them), an admission's encoder call need
not stall the running rows: ``EncoderOverlap`` runs it on an encoder thread and the newcomers
join at the first step boundary after it is done (``Engine.encode`` then ``Engine.place``; the
engine's ``encode`` touches no batch state). One admission is in flight at a time.

On one core there is nothing to overlap with: the batcher encodes in line, and the admission
policy charges the encoder call to the running rows it stalls (service/scheduling/admission.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from service.metrics import ServiceMetrics
from service.runtime.groups import EncodedRequests
from service.scheduling.sentences import ScheduledSentence

logger = logging.getLogger(__name__)
T = TypeVar("T")

# The encoder thread runs at the OS's idle priority (Linux SCHED_IDLE): on busy cores the
# running rows' decoder steps and the HTTP event loop go first, and newcomers' encoder calls
# take what is left.
ENCODER_IDLE_PRIORITY = True
# An encoder call in flight for longer than this has the engine thread stop stepping and wait
# for it (freeing a core for it), so an idle-priority encoder thread cannot starve newcomers
# on busy cores. A safety bound, not a tuning knob: every wait stalls the running rows, so a
# shorter bound waits more often and a longer one lets newcomers wait longer.
ENCODER_MAX_LAG_S = 0.15


def _idle_priority_for_this_thread() -> None:
    """Put the calling thread in the SCHED_IDLE class (Linux schedules threads on their own;
    lowering one's own priority needs no privilege). A waking thread takes a core that runs
    only SCHED_IDLE work as if it were free. Elsewhere, or where it is refused, the thread
    keeps its priority."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as error:
        logger.warning("the encoder thread keeps its priority (SCHED_IDLE refused: %s)", error)


class EncoderCpuShare:
    """The share of a core the encoder thread gets while the running rows step.

    The encoder overlap assumes that the encoder thread and the engine thread each have a
    core. ONNX Runtime with one intra-op thread computes in the calling thread, so the
    encoder thread's CPU time over wall time around its encoder call (``time.thread_time`` /
    ``time.perf_counter``) is the share of a core it actually got; waits for the GIL count
    as not running. Over every ``window`` overlapped encodings the share is sum(cpu) /
    sum(wall) (``mt_encoder_cpu_share``; a histogram of the windows goes to the log at close).
    With several intra-op threads it is the calling thread's share, a lower bound of the pool's.

    The share is reported, not acted on: on busy shared cores it falls because other
    processes take the cores, which standing the overlap down does not cure.

    ``timed`` runs on the encoder thread and touches no state; ``record`` and ``summary`` are
    the engine thread's. The clocks are arguments for the tests.
    """

    def __init__(
        self,
        window: int = 8,
        *,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self._cpu_clock = cpu_clock
        self._wall_clock = wall_clock
        self._cpu_s = 0.0  # this window's encoder CPU seconds
        self._wall_s = 0.0  # and wall seconds
        self._encodings = 0  # encodings in this window
        self.windows_by_tenth = [0] * 11  # whole windows by share, in tenths of a core

    def timed(self, work: Callable[[], T]) -> tuple[T, float, float]:
        """``work()``, with the CPU and wall seconds of the calling thread it took."""
        cpu_started, wall_started = self._cpu_clock(), self._wall_clock()
        result = work()
        return result, self._cpu_clock() - cpu_started, self._wall_clock() - wall_started

    def record(self, cpu_s: float, wall_s: float) -> float | None:
        """One overlapped encoding's CPU and wall seconds; the window's share of a core when
        this encoding completes a window, else None."""
        self._cpu_s += cpu_s
        self._wall_s += wall_s
        self._encodings += 1
        if self._encodings < self.window:
            return None
        share = min(1.0, self._cpu_s / self._wall_s) if self._wall_s > 0 else 1.0
        self.windows_by_tenth[int(share * 10)] += 1
        self._cpu_s = self._wall_s = 0.0
        self._encodings = 0
        return share

    def summary(self) -> str:
        """One line for the log: how many windows got which share of a core."""
        shares = " ".join(
            f"{tenth / 10:.1f}:{count}"
            for tenth, count in enumerate(self.windows_by_tenth)
            if count
        )
        return (
            f"{sum(self.windows_by_tenth)} windows of {self.window} overlapped encodings, "
            f"by share of a core the encoder thread got [{shares or '-'}]"
        )


@dataclass
class Encoding:
    """An admission whose encoder call runs on the encoder thread."""

    sentences: list[ScheduledSentence]
    future: Future[tuple[EncodedRequests, float, float]]  # encoded, CPU s, wall s
    admitted_at: float  # when admission chose the sentences (their queue wait ends there)

    @property
    def sentence_ids(self) -> set[int]:
        return {sentence.sentence_id for sentence in self.sentences}


class EncoderOverlap:
    """The encoder thread and the one admission in flight on it (engine thread only)."""

    def __init__(
        self,
        encode: Callable[[list], EncodedRequests],
        metrics: ServiceMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._encode = encode
        self._metrics = metrics
        self._clock = clock
        self.share = EncoderCpuShare()  # the share of a core the encoder thread gets
        self._executor: ThreadPoolExecutor | None = None
        self.in_flight: Encoding | None = None

    @property
    def done(self) -> bool:
        """An admission's encoder call has finished; it joins at the next step boundary."""
        encoding = self.in_flight
        return encoding is not None and encoding.future.done()

    def start(self, sentences: list[ScheduledSentence]) -> None:
        """Start the newcomers' encoder call on the encoder thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                1, thread_name_prefix="encoder", initializer=self._encoder_thread_started
            )
        rows = [sentence.row for sentence in sentences]

        def encode() -> tuple[EncodedRequests, float, float]:
            started = time.perf_counter()  # engine work, on another thread
            try:
                return self.share.timed(lambda: self._encode(rows))
            finally:
                self._metrics.engine_busy.inc(time.perf_counter() - started)

        self.in_flight = Encoding(sentences, self._executor.submit(encode), self._clock())

    def _encoder_thread_started(self) -> None:
        self._metrics.threads.register("encoder")
        if ENCODER_IDLE_PRIORITY:
            _idle_priority_for_this_thread()

    def lagging(self) -> bool:
        """Whether the encoder call in flight has run past ``ENCODER_MAX_LAG_S``: the engine
        thread then waits for it, which frees its core for the encoder thread. Counted when
        so."""
        encoding = self.in_flight
        if encoding is None or encoding.future.done():
            return False
        if self._clock() - encoding.admitted_at <= ENCODER_MAX_LAG_S:
            return False
        self._metrics.encoder_lag_waits.inc()
        return True

    def wait(self) -> None:
        if self.in_flight is not None:
            self.in_flight.future.exception()  # blocks until done; raises nothing

    def finish(self) -> tuple[Encoding, EncodedRequests]:
        """The finished admission, taken out of flight (raises what its encoder call raised;
        the encoding is out of flight either way)."""
        encoding, self.in_flight = self.in_flight, None
        assert encoding is not None
        try:
            encoded, cpu_s, wall_s = encoding.future.result()
        except Exception as error:
            raise EncodingFailed(encoding) from error
        if (share := self.share.record(cpu_s, wall_s)) is not None:
            self._metrics.encoder_cpu_share.set(share)
        return encoding, encoded

    def close(self) -> list[ScheduledSentence]:
        """Stop the encoder thread; the sentences of an admission still in flight."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        leftovers = self.in_flight.sentences if self.in_flight is not None else []
        self.in_flight = None
        if self._executor is not None:
            logger.info("encoder overlap: %s", self.share.summary())
        return leftovers


class EncodingFailed(Exception):
    """An overlapped encoder call raised; ``encoding`` has the sentences it was for."""

    def __init__(self, encoding: Encoding) -> None:
        super().__init__("the encoder call failed")
        self.encoding = encoding
