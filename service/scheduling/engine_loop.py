"""The engine thread: one loop that owns the engine, each turn of it vLLM v1's ``step()``::

    schedule   ``Scheduler.schedule``: this boundary's plan, complete (drops, newcomers, where
               their encoder call runs; service/scheduling/scheduler.py)
    execute    carry it out: drop, join the newcomers (``BatchJoins``), one decoder step
    update     ``Scheduler.update``: the finished sentences get their results

The loop decides nothing itself. Engine errors fail the sentences they concern and the loop
goes on; a bug in the loop itself fails everything and refuses new work (``queue.death``),
which the health checks see. Its time is told by the scheduler's ``PhaseClock``
(service/scheduling/timeline.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from service.errors import EngineFailure, InvalidRow, NotAccepting
from service.runtime.types import FinishedRequest, RejectedRequest
from service.scheduling.engine_api import DecodeEngine
from service.scheduling.overlap import EncoderOverlap, EncodingFailed
from service.scheduling.scheduler import EncoderCall, Scheduler, SchedulerOutput
from service.scheduling.sentences import ScheduledSentence, one_wakeup
from service.scheduling.timeline import PhaseClock

logger = logging.getLogger(__name__)


class EngineLoop:
    """The engine thread's loop (every method runs on the engine thread)."""

    def __init__(
        self,
        engine: DecodeEngine,
        scheduler: Scheduler,
        *,
        clock: Callable[[], float],
        turn: Callable[[], AbstractContextManager[object]],
    ) -> None:
        """``turn``: several models on one device take turns (service/scheduling/turns.py),
        held around each execute and update."""
        self.engine = engine
        self.scheduler = scheduler
        self.queue = scheduler.queue
        self.overlap = scheduler.overlap
        self.metrics = scheduler.metrics
        self.phases = scheduler.phases
        self._turn = turn
        self.joins = BatchJoins(engine, scheduler, self.phases, clock, self._drop)

    def run(self) -> None:
        self.metrics.threads.register("engine")
        try:
            while self.step():
                pass
            self._stop(NotAccepting("shutting_down"))
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

    def step(self) -> bool:
        """One step boundary: schedule, execute, update. False once the loop is to stop."""
        output = self.scheduler.schedule()
        if output is None:
            return False
        self._drop(output.dropped)
        if output.busy:
            with self.phases.turn(self._turn()):
                finished = self._execute(output)
                if finished is not None:
                    with self.phases.phase("update"), one_wakeup():
                        self.scheduler.update(finished)
                        self.metrics.inflight_rows.set(self.engine.active_rows)
        return True

    def _execute(self, output: SchedulerOutput) -> list[FinishedRequest] | None:
        """The newcomers join as ``output`` says, then one step over the running rows; what
        it finished (None: no step ran, or it failed)."""
        if output.encoded_joins:
            self.joins.encoded(wait=output.await_encoder)
        if output.newcomers:
            if output.encoder is EncoderCall.OVERLAPPED:
                assert self.overlap is not None
                self.overlap.start(output.newcomers)
            else:
                self.joins.in_line(output.newcomers)
        return self._decode() if self.scheduler.running else None

    def _decode(self) -> list[FinishedRequest] | None:
        engine, metrics = self.engine, self.metrics
        rows_in_step, calls_in_step = engine.active_rows, engine.groups
        try:
            with self.phases.decoder_step(lambda: engine.decoder_seconds):
                finished = engine.step()
        except Exception as error:
            # The batch state is unknown now: fail every row in it and start afresh.
            logger.exception("engine.step failed with %d rows", rows_in_step)
            metrics.engine_errors.inc()
            failed = list(self.scheduler.running.values())
            self._drop(list(self.scheduler.running))
            name = type(error).__name__
            for sentence in failed:
                sentence.deliver(None, EngineFailure(f"the engine failed during decoding ({name})"))
            return None
        metrics.batch_rows.observe(rows_in_step)
        metrics.decode_steps.inc()
        metrics.decoder_calls.inc(calls_in_step)
        return finished

    def _drop(self, sentence_ids: list[int]) -> None:
        if not sentence_ids:
            return
        self.scheduler.remove(sentence_ids)
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
        running = self.scheduler.running
        leftovers += list(running.values())
        with contextlib.suppress(Exception):
            self._drop(list(running))
        for sentence in leftovers:
            sentence.deliver(None, error)
        self.metrics.queue_depth.set(0)
        self.scheduler.idle.set()


class BatchJoins:
    """Chosen newcomers join the running batch: encoded in line or on the encoder thread,
    placed between two steps, then running (``Scheduler.joined``) or failed with the engine's
    error."""

    def __init__(
        self,
        engine: DecodeEngine,
        scheduler: Scheduler,
        phases: PhaseClock,
        clock: Callable[[], float],
        drop: Callable[[list[int]], None],
    ) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.metrics = scheduler.metrics
        self.phases = phases
        self._clock = clock
        self._drop = drop  # sentences leave the batch (the engine loop's ``_drop``)

    def in_line(self, newcomers: list[ScheduledSentence]) -> None:
        """Encode and place the newcomers now, the running rows waiting."""
        admitted_step, now = self.engine.steps, self._clock()
        try:
            with self.phases.phase("encode") as encoding:
                encoded = self.engine.encode([s.row for s in newcomers])
            with self.phases.phase("place") as placing:
                self.engine.place(encoded)
        except Exception as error:
            self._fail(newcomers, error)
            return
        if self.scheduler.running:  # the rows this admission kept waiting
            self.metrics.admission_stall.observe(encoding.seconds + placing.seconds)
        self._admitted(newcomers, encoded.rejected, admitted_step, now)

    def encoded(self, wait: bool) -> None:
        """The admission on the encoder thread joins if its encoder call is done, waited for
        where ``wait`` (nothing runs meanwhile) or where it lags (``EncoderOverlap.lagging``:
        waiting frees the engine thread's core for it)."""
        overlap = self.scheduler.overlap
        assert overlap is not None
        if wait or overlap.lagging():
            with self.phases.phase("wait"):
                overlap.wait()
        if overlap.done:
            self._place_encoded(overlap)

    def _place_encoded(self, overlap: EncoderOverlap) -> None:
        try:
            encoding, encoded = overlap.finish()
            with self.phases.phase("place") as placing:
                self.engine.place(encoded)
            if self.scheduler.running:
                self.metrics.admission_stall.observe(placing.seconds)
        except EncodingFailed as failure:
            self._fail(failure.encoding.sentences, failure.__cause__)
            return
        except Exception as error:
            self._fail(encoding.sentences, error)
            return
        # the queue wait ends when the admission was chosen; the rows join the batch now
        self._admitted(
            encoding.sentences, encoded.rejected, self.engine.steps, encoding.admitted_at
        )

    def _fail(self, newcomers: list[ScheduledSentence], error: BaseException | None) -> None:
        logger.error("admitting %d sentences failed", len(newcomers), exc_info=error)
        self.metrics.engine_errors.inc()
        self._drop([s.sentence_id for s in newcomers])
        name = type(error).__name__
        for sentence in newcomers:
            sentence.deliver(None, EngineFailure(f"the engine failed to encode the input ({name})"))

    def _admitted(
        self,
        newcomers: list[ScheduledSentence],
        rejected: Sequence[RejectedRequest],
        admitted_step: int,
        admitted_at: float,
    ) -> None:
        refused = {rejection.request_id: rejection.reason for rejection in rejected}
        for sentence in newcomers:
            if sentence.sentence_id in refused:
                reason = refused[sentence.sentence_id]
                sentence.deliver(None, InvalidRow(f"the sentence cannot be decoded: {reason}"))
                continue
            sentence.admitted_step = admitted_step
            sentence.queue_wait_s = admitted_at - sentence.enqueued_at
            self.scheduler.joined(sentence)
            self.metrics.queue_wait.observe(sentence.queue_wait_s)
            self.metrics.input_tokens.inc(sentence.src_len)
        self.metrics.admitted_rows.observe(
            sum(s.rows for s in newcomers if s.sentence_id not in refused)
        )
