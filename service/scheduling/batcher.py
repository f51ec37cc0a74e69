"""Continuous (iteration-level) batching: one engine thread serves every HTTP request.

The engine is not thread-safe and a decoder step is the unit of work, so one thread owns it
and loops, like vLLM's ``step()``: schedule, execute, update (``EngineLoop``:
service/scheduling/engine_loop.py, carrying out what its ``Scheduler`` decides:
service/scheduling/scheduler.py).

A sentence that arrives while others decode joins at a step boundary; a finished row leaves
at once, so a short request never waits for an unrelated long one. The event loop never runs
inference: ``submit`` queues ``ScheduledSentence``s (service/scheduling/sentences.py) and
awaits asyncio futures that the engine thread resolves with ``loop.call_soon_threadsafe``.

The parts: when admission is open (``ContinuousPolicy``, ``StaticPolicy``:
service/scheduling/scheduler.py), who joins and whether joining now beats waiting
(``AdmissionChooser``: service/scheduling/chooser.py, with ``Admitter`` and ``LatencyBudget``:
service/scheduling/admission.py), encoder calls on a spare core (``EncoderOverlap``:
service/scheduling/overlap.py). The batcher works on token ids; text is the translator's
business (service/translation/translator.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from service.metrics import ServiceMetrics
from service.runtime.types import DecodeRequest
from service.scheduling.engine_api import DecodeEngine
from service.scheduling.engine_loop import EngineLoop
from service.scheduling.overlap import EncoderOverlap
from service.scheduling.scheduler import Scheduler
from service.scheduling.sentences import RowResult, ScheduledSentence, SentenceQueue
from service.scheduling.settings import DEFAULT_MAX_QUEUE, BatchingPolicy, BatchingSettings
from service.scheduling.stream import RowStream, all_rows
from service.scheduling.timeline import PhaseClock

logger = logging.getLogger(__name__)

__all__ = ["BatchingSettings", "ContinuousBatcher", "DecodeEngine", "RowResult", "RowStream"]


class ContinuousBatcher:
    """Iteration-level scheduler in front of one engine.

    ``max_batch_rows`` bounds rows per decoder step; ``max_batch_tokens`` bounds the padded
    source and past of the running batch; ``max_queue`` bounds waiting sentences (beyond it
    ``submit`` raises :class:`QueueFull` at once rather than letting latency grow).
    """

    def __init__(
        self,
        engine: DecodeEngine,
        config: BatchingSettings | None = None,
        *,
        metrics: ServiceMetrics | None = None,
        spare_core: bool = True,
        turn: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``config``: the batching settings group as it is (default ``BatchingSettings()``;
        ``max_queue`` unset means ``DEFAULT_MAX_QUEUE``: ``BatchingSettings.queue_for`` sizes
        it). ``spare_core``: whether a core is free for the encoder thread (service/wiring.py
        asks the CPU budget); without one the encoder runs in line whatever
        ``encoder_overlap`` says. ``turn``: several models on one device take turns
        (service/scheduling/turns.py), held around each admission and step. ``clock``: what
        queue waits, idle waits and the encoder's lag are measured on."""
        config = config or BatchingSettings()
        self.config = config
        self.engine = engine
        self.metrics = metrics if metrics is not None else ServiceMetrics().for_model("default")
        self._clock = clock
        self._turn = turn
        encoder_overlap = config.encoder_overlap and spare_core
        self.batching: BatchingPolicy = config.batching
        self.max_batch_rows = config.max_batch_rows
        self.max_queue = config.max_queue or DEFAULT_MAX_QUEUE
        self.queue = SentenceQueue(self.max_queue, clock)
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        overlap = (
            EncoderOverlap(engine.encode, self.metrics, clock)
            if encoder_overlap and config.batching == "continuous"
            else None
        )
        scheduler = Scheduler(
            engine,
            self.queue,
            config,
            overlap,
            self.metrics,
            phases=PhaseClock(self.metrics.engine_phase, busy=self.metrics.engine_busy),
            idle=self._idle,
            clock=clock,
        )
        self.idle_wait_s = scheduler.idle_wait_s
        self._loop = EngineLoop(engine, scheduler, clock=clock, turn=turn)

    # --- event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop.run, name="engine-loop", daemon=True)
            self._thread.start()
            overlap = self._loop.overlap is not None
            logger.info("batching: %s, encoder overlap %s", self.batching, overlap)

    async def until_live(self) -> None:
        """In this process the engine is live once started."""

    @property
    def accepting(self) -> bool:
        return self.queue.accepting

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def encoded_waiting_to_join(self) -> bool:
        """An admission's encoder call has finished on the encoder thread; its rows join the
        batch at the next step boundary."""
        overlap = self._loop.overlap
        return overlap is not None and overlap.done

    async def submit(
        self,
        rows: Sequence[DecodeRequest],
        timeout_s: float | None = None,
        background: bool = False,
    ) -> list[RowResult]:
        """Decode ``rows``; results in the same order. All rows of one call enter the queue
        together or not at all (:class:`QueueFull`). On timeout (``TimeoutError``) or
        cancellation (client gone) the rows still queued leave the queue and the rows in the
        batch are dropped from the engine. ``background``: a document job's rows, admitted
        after every waiting interactive one and a few at a time."""
        if not rows:
            return []
        return await all_rows(self, self.put(rows, background), timeout_s)

    def submit_as_completed(
        self,
        rows: Sequence[DecodeRequest],
        timeout_s: float | None = None,
        background: bool = False,
    ) -> RowStream:
        """Queue ``rows`` now (all or none: :class:`QueueFull`, :class:`NotAccepting` raise
        here) and return an async iterator of ``(index in rows, result)`` in the order the
        rows finish. When the iteration stops early, the unfinished rows are abandoned."""
        return RowStream(self, self.put(rows, background) if rows else [], timeout_s)

    def put(
        self, rows: Sequence[DecodeRequest], background: bool = False
    ) -> list[ScheduledSentence]:
        """Queue ``rows`` now (all or none: :class:`QueueFull`, :class:`NotAccepting` raise
        here): their sentences, whose futures get the results; the caller ``abandon``s those
        nobody waits for any more (an engine core answers its front-ends per step from them)."""
        sentences = self.queue.put(rows, background)
        self.metrics.queue_depth.set(len(self.queue))
        self._idle.clear()
        return sentences

    def abandon(self, sentences: Sequence[ScheduledSentence]) -> None:
        """Sentences nobody waits for any more leave the queue or the batch."""
        # Cancelling the gather has already cancelled the futures: "unfinished" is every
        # sentence without a result or an error of its own.
        unfinished = {
            s.sentence_id for s in sentences if s.future.cancelled() or not s.future.done()
        }
        for sentence in sentences:
            sentence.future.cancel()
        if unfinished:
            with self.queue.cond:
                self.queue.withdraw(unfinished)
                self.metrics.queue_depth.set(len(self.queue))

    def begin_shutdown(self) -> None:
        """Refuse new work from now on; what is queued or decoding goes on."""
        with self.queue.cond:
            self.queue.accepting = False

    async def shutdown(self, grace_s: float) -> bool:
        """Stop admitting, let queued and running work finish for up to ``grace_s`` seconds,
        then fail whatever is left and stop the engine thread. Returns whether it drained."""
        self.begin_shutdown()
        drained = await asyncio.to_thread(self._idle.wait, grace_s)
        await asyncio.to_thread(self.close)
        return drained

    def close(self, join_timeout_s: float = 10.0) -> None:
        """Stop the engine thread after its current step; unfinished requests fail with
        :class:`NotAccepting`."""
        with self.queue.cond:
            self.queue.accepting = False
            self.queue.stopping = True
            self.queue.cond.notify()
        if self._thread is not None:
            # A step that never returns (a hung device) must not keep the process alive:
            # the thread is a daemon, so giving up on it lets the process exit.
            self._thread.join(join_timeout_s)
            if self._thread.is_alive():
                logger.error("the engine thread did not stop within %.0f s", join_timeout_s)

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running (False after it died; True before start)."""
        thread = self._thread
        return self.queue.death is None and (
            thread is None or thread.is_alive() or self.queue.stopping
        )
