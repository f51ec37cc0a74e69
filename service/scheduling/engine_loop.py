"""The engine thread: one loop that owns the engine, like vLLM's ``step()``::

    schedule   wait for work; drop cancelled sentences; choose who joins (policy, scheduler)
    execute    encode and place the newcomers (in line, or on the encoder thread); one step
    update     resolve the futures of the sentences that finished

Engine errors fail the sentences they concern and the loop goes on; a bug in the loop itself
fails everything and refuses new work (``queue.death``), which the health checks see.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from service.errors import EngineFailure, NotAccepting
from service.metrics import ServiceMetrics
from service.runtime.types import FinishedRequest
from service.scheduling.chooser import AdmissionChooser
from service.scheduling.deferral import BatchChanges, DeferralHold
from service.scheduling.engine_api import DecodeEngine
from service.scheduling.joins import BatchJoins
from service.scheduling.overlap import EncoderOverlap
from service.scheduling.policies import AdmissionPolicy
from service.scheduling.sentences import RowResult, ScheduledSentence, SentenceQueue
from service.scheduling.timeline import PhaseClock

logger = logging.getLogger(__name__)


@dataclass
class Schedule:
    """What the engine thread does between two boundaries."""

    dropped: list[int]
    newcomers: list[ScheduledSentence]


class EngineLoop:
    """The engine thread's state and loop (every method runs on the engine thread)."""

    def __init__(
        self,
        engine: DecodeEngine,
        queue: SentenceQueue,
        policy: AdmissionPolicy,
        scheduler: AdmissionChooser,
        overlap: EncoderOverlap | None,
        metrics: ServiceMetrics,
        *,
        idle: threading.Event,
        clock: Callable[[], float],
        turn: Callable[[], AbstractContextManager[object]],
        admission_window: int,
        track_knee: bool,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.policy = policy
        self.scheduler = scheduler
        self.overlap = overlap
        self.metrics = metrics
        self._idle = idle  # set while there is no work at all
        self._clock = clock
        self._turn = turn
        # How far past the head of the queue admission looks for sentences that fit the
        # running batch's width; bounded, so a sentence is overtaken only so often.
        self.admission_window = admission_window
        self._track_knee = track_knee
        self._running: dict[int, ScheduledSentence] = {}
        self.batch_changes = BatchChanges()
        # the last choice, where it deferred everyone: choosing again is skipped while it holds
        self.hold = DeferralHold(self.batch_changes)
        self.clock = PhaseClock(metrics.engine_phase)  # where this thread's time goes
        self.joins = BatchJoins(
            engine, self._running, self.batch_changes, metrics, self.clock, clock, self._drop
        )

    def run(self) -> None:
        self.metrics.threads.register("engine")
        try:
            self._serve()
        except BaseException as error:
            # A bug in the loop itself (engine errors are caught where they happen): nothing
            # would ever resolve the futures. Fail them all, refuse new work, let ``alive``
            # tell the health checks.
            logger.critical("the engine thread died", exc_info=error)
            with self.queue.cond:
                self.queue.death = error
                self.queue.accepting = False
            failure = EngineFailure(f"the engine thread stopped ({type(error).__name__})")
            self._stop(failure)

    def _serve(self) -> None:
        while (schedule := self._schedule()) is not None:
            if schedule.dropped:
                self._drop(schedule.dropped)
            if schedule.newcomers or self._running or self._encoding:
                asked = time.perf_counter()
                with self._turn():
                    busy_since = time.perf_counter()
                    self.clock.add("turn", busy_since - asked)
                    self._execute(schedule.newcomers)
                    self.metrics.engine_busy.inc(time.perf_counter() - busy_since)
        self._stop(NotAccepting("shutting_down"))

    @property
    def _encoding(self) -> bool:
        return self.overlap is not None and self.overlap.in_flight is not None

    def _schedule(self) -> Schedule | None:
        """Wait for work; the sentences to drop and to admit at this boundary (None: stop)."""
        queue, clock, engine = self.queue, self.clock, self.engine
        with queue.cond:
            while not (self._running or self._encoding or queue.to_drop or queue.stopping):
                waited = time.perf_counter()
                if not queue.waiting:
                    self._idle.set()
                    queue.cond.wait()
                    clock.add("idle", time.perf_counter() - waited)
                elif (wait_s := self.policy.wait_s(queue)) > 0:
                    queue.cond.wait(wait_s)  # a submit wakes it earlier
                    clock.add("wait", time.perf_counter() - waited)
                else:
                    break
            chosen = time.perf_counter()
            if queue.stopping:
                return None
            dropped = [sentence_id for sentence_id in queue.to_drop if sentence_id in self._running]
            # ids of an admission still being encoded are dropped once it has joined
            encoding = self.overlap.in_flight if self.overlap is not None else None
            in_flight = encoding.sentence_ids if encoding is not None else set()
            queue.to_drop = {i for i in queue.to_drop if i in in_flight}
            version, arrived_rows, row_rate = queue.version, queue.arrived_rows, queue.row_rate
            units = (
                queue.units(self.admission_window)
                if encoding is None
                and not (self._running and not dropped and self.hold.holds(engine.steps, queue))
                and self.policy.open(queue, self._running_rows(dropped))
                else {}
            )
        staying = [s for i, s in self._running.items() if i not in dropped]
        newcomers: list[ScheduledSentence] = []
        if units:
            # CPU, not wall: on one core the event loop takes the core mid-choice
            scheduler, choice_cpu = self.scheduler, time.thread_time()
            newcomers = scheduler.choose(list(units.values()), staying, row_rate)
            self.metrics.admission_choice_cpu.inc(time.thread_time() - choice_cpu)
            if newcomers:
                self.hold.clear()
            else:
                self.hold.record(
                    next(iter(units)) if scheduler.head_refused else version,  # the head first
                    head_refused=scheduler.head_refused,
                    head_over_stall=scheduler.head_over_stall,
                    step=engine.steps,
                    deficit=scheduler.deficit,
                    arrived_rows=arrived_rows,
                )
        if newcomers:
            with queue.cond:
                newcomers = queue.take(newcomers)
                self.metrics.queue_depth.set(len(queue))
        clock.add("schedule", time.perf_counter() - chosen)
        return Schedule(dropped, newcomers)

    def _running_rows(self, dropped: Sequence[int] = ()) -> int:
        return sum(s.rows for i, s in self._running.items() if i not in dropped)

    def _execute(self, newcomers: list[ScheduledSentence]) -> None:
        """Admit (in line or on the encoder thread), then one step over the running rows."""
        overlap = self.overlap
        if overlap is not None and overlap.in_flight is not None:
            if not self._running or overlap.lagging():
                # nothing to step meanwhile, or the encoder call is not getting a core
                with self.clock.phase("wait"):
                    overlap.wait()
            if overlap.done:
                self.joins.place_encoded(overlap)
        if newcomers:
            if overlap is not None and self._running:
                overlap.start(newcomers)
            else:
                self.joins.in_line(newcomers)
        if self._running:
            self._step()

    def _step(self) -> None:
        rows_in_step, calls_in_step = self.engine.active_rows, self.engine.groups
        started, decoder_before = time.perf_counter(), self.engine.decoder_seconds
        try:
            finished = self.engine.step()
            decoder_s = self.engine.decoder_seconds - decoder_before
            self.clock.add("decoder", decoder_s)
            self.clock.add("step_host", time.perf_counter() - started - decoder_s)
        except Exception as error:
            # The batch state is unknown now: fail every row in it and start afresh.
            logger.exception("engine.step failed with %d rows", rows_in_step)
            self.metrics.engine_errors.inc()
            failed = list(self._running.values())
            self._drop(list(self._running))
            name = type(error).__name__
            for sentence in failed:
                sentence.deliver(None, EngineFailure(f"the engine failed during decoding ({name})"))
            return
        self.metrics.batch_rows.observe(rows_in_step)
        self.metrics.decode_steps.inc()
        self.metrics.decoder_calls.inc(calls_in_step)
        with self.clock.phase("update"):
            self._update(finished)

    def _update(self, finished: list[FinishedRequest]) -> None:
        """Finished sentences get their results."""
        finished_step = self.engine.steps
        for done in finished:
            sentence = self._running.pop(done.request_id, None)  # type: ignore[call-overload]
            if sentence is None:
                continue  # dropped meanwhile
            self.batch_changes.left(sentence.rows)
            tokens = list(done.tokens)
            self.scheduler.lengths.observe(sentence.src_len, done.steps)
            self.metrics.generated_tokens.inc(len(tokens))
            self.metrics.sentences.inc()
            sentence.deliver(
                RowResult(
                    tokens,
                    sentence.admitted_step,
                    finished_step,
                    sentence.queue_wait_s,
                    list(done.hypotheses),
                )
            )
        self.metrics.inflight_rows.set(self.engine.active_rows)
        if self._track_knee and finished_step % 16 == 0:
            scheduler = self.scheduler
            knee = self.engine.estimate(
                (), scheduler.config.max_batch_rows, scheduler.cost_tolerance
            )
            self.metrics.row_limit.set(knee.row_limit or 0)

    def _drop(self, sentence_ids: list[int]) -> None:
        if not sentence_ids:
            return
        for sentence_id in sentence_ids:
            sentence = self._running.pop(sentence_id, None)
            self.batch_changes.left(sentence.rows if sentence is not None else 0)
        try:
            self.engine.drop(sentence_ids)
        except Exception:
            logger.exception("engine.drop failed")
            self.metrics.engine_errors.inc()
        self.metrics.inflight_rows.set(self.engine.active_rows)

    def _stop(self, error: BaseException) -> None:
        """Fail everything queued, encoding or running with ``error`` (engine thread, last)."""
        with self.queue.cond:
            leftovers = self.queue.drain()
        if self.overlap is not None:
            leftovers += self.overlap.close()
        leftovers += list(self._running.values())
        with contextlib.suppress(Exception):
            self._drop(list(self._running))
        for sentence in leftovers:
            sentence.deliver(None, error)
        self.metrics.queue_depth.set(0)
        self._idle.set()
