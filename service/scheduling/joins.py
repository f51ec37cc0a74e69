"""Chosen newcomers joining the running batch: encoded in line or on the encoder thread,
placed between two steps, then running, or failed with the engine's error.

The engine loop (service/scheduling/engine_loop.py) decides when; ``BatchJoins`` does the
joining and keeps the loop's record of running sentences, the batch changes and the metrics
in step with it (every method runs on the engine thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from service.errors import EngineFailure, InvalidRow
from service.metrics import ServiceMetrics
from service.runtime.types import RejectedRequest
from service.scheduling.deferral import BatchChanges
from service.scheduling.engine_api import DecodeEngine
from service.scheduling.overlap import EncoderOverlap, EncodingFailed
from service.scheduling.sentences import ScheduledSentence
from service.scheduling.timeline import PhaseClock

logger = logging.getLogger(__name__)


class BatchJoins:
    """Newcomers join the batch; ``running`` is the engine loop's own record (shared)."""

    def __init__(
        self,
        engine: DecodeEngine,
        running: dict[int, ScheduledSentence],
        batch_changes: BatchChanges,
        metrics: ServiceMetrics,
        phases: PhaseClock,
        clock: Callable[[], float],
        drop: Callable[[list[int]], None],
    ) -> None:
        self.engine = engine
        self.running = running
        self.batch_changes = batch_changes
        self.metrics = metrics
        self.phases = phases
        self._clock = clock
        self._drop = drop  # sentences leave the batch (the engine loop's ``_drop``)

    def in_line(self, newcomers: list[ScheduledSentence]) -> None:
        """Encode and place the newcomers now, the running rows waiting."""
        admitted_step, now = self.engine.steps, self._clock()
        started = time.perf_counter()
        try:
            encoded = self.engine.encode([s.row for s in newcomers])
            encoded_at = time.perf_counter()
            self.engine.place(encoded)
        except Exception as error:
            self._fail(newcomers, error)
            return
        placed_at = time.perf_counter()
        self.phases.add("encode", encoded_at - started)
        self.phases.add("place", placed_at - encoded_at)
        if self.running:  # the rows this admission kept waiting
            self.metrics.admission_stall.observe(placed_at - started)
        self._admitted(newcomers, encoded.rejected, admitted_step, now)

    def place_encoded(self, overlap: EncoderOverlap) -> None:
        """The admission encoded on the encoder thread joins the batch."""
        try:
            encoding, encoded = overlap.finish()
            started = time.perf_counter()
            self.engine.place(encoded)
            stall_s = time.perf_counter() - started
            self.phases.add("place", stall_s)
            if self.running:
                self.metrics.admission_stall.observe(stall_s)
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
            self.running[sentence.sentence_id] = sentence
            self.batch_changes.joined(sentence.rows)
            self.metrics.queue_wait.observe(sentence.queue_wait_s)
            self.metrics.input_tokens.inc(sentence.src_len)
        self.metrics.admitted_rows.observe(
            sum(s.rows for s in newcomers if s.sentence_id not in refused)
        )
