"""Continuous (iteration-level) batching: one engine thread serves every HTTP request.

The engine is not thread-safe and a decoder step is the unit of work, so one thread owns it
and loops, like vLLM's ``step()``::

    schedule   drop cancelled sentences; choose who joins (policy, admitter, budget)
    execute    encode and place the newcomers (in line, or on the encoder thread); one step
    update     resolve the futures of the sentences that finished

A sentence that arrives while others decode joins at a step boundary; a finished row leaves
at once, so a short request never waits for an unrelated long one. The event loop never runs
inference: ``submit`` queues ``ScheduledSentence``s (service/scheduling/sentences.py) and awaits asyncio
futures that the engine thread resolves with ``loop.call_soon_threadsafe``.

The parts: when admission is open (``ContinuousPolicy``, ``StaticPolicy``:
service/scheduling/policies.py), who joins and whether joining now beats waiting (``Admitter``,
``LatencyBudget``: service/scheduling/admission.py), encoder calls on a spare core
(``EncoderOverlap``: service/scheduling/overlap.py). The batcher works on token ids; text is the
translator's business (service/translation/translator.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from service.metrics import ServiceMetrics
from service.runtime.types import DecodeRequest
from service.scheduling.engine_api import DecodeEngine
from service.scheduling.engine_loop import EngineLoop
from service.scheduling.overlap import EncoderCpuShare, EncoderOverlap
from service.scheduling.policies import (
    AdmissionPolicy,
    BatchingPolicy,
    ContinuousPolicy,
    IdleWait,
    StaticPolicy,
)
from service.scheduling.scheduler import Scheduler
from service.scheduling.sentences import RowResult, ScheduledSentence, SentenceQueue
from service.scheduling.stream import RowStream

logger = logging.getLogger(__name__)

__all__ = ["BatchingConfig", "ContinuousBatcher", "DecodeEngine", "RowResult", "RowStream"]


@dataclass(frozen=True)
class BatchingConfig:
    """Every scheduling knob of the batcher (built from the settings by service/wiring.py)."""

    max_batch_rows: int = 64
    max_batch_tokens: int = 8192
    max_queue: int = 256
    batching: BatchingPolicy = "continuous"
    static_max_wait_s: float = 0.01
    # Continuous: how long the oldest queued sentence waits for company while the engine is
    # idle (the settings make it static_max_wait_s where the encoder runs in line, else 0).
    idle_wait_s: float = 0.0
    admission_window: int | None = None  # default: 4 x max_batch_rows
    # Cost-aware admission (continuous): newcomers join only while the batch stays within the
    # row count at which the engine's learned step cost puts this machine's knee (the most
    # rows whose tokens/s are within ``cost_tolerance`` of the best), and only when the
    # latency budget says joining now beats waiting.
    cost_aware: bool = True
    cost_tolerance: float = 0.05
    # An admission encoded in line (no spare core) stalls the running rows for at most this
    # many of their predicted steps; bigger ones are cut into chunks between steps.
    max_stall_steps: float = 2.0
    # Rows of background sentences (document jobs) in the batch at most; they join only when
    # no interactive sentence waits.
    background_max_rows: int = 4
    # ... and join beside running interactive rows only once the oldest has waited this long.
    background_max_wait_s: float = 1.0
    # Source tokens one overlapped admission encodes (the encoder thread's share).
    max_admit_tokens: int = 1024
    # Continuous, with a spare core: encode newcomers on a second thread while the running
    # rows step; they join once encoded, one admission in flight at a time.
    encoder_overlap: bool = True
    # The encoder thread runs at the OS's idle priority (Linux SCHED_IDLE): the decoder steps
    # and the event loop go first. An encoder call in flight longer than ``encoder_max_lag_s``
    # has the engine thread wait for it, which frees its core (0: never).
    encoder_idle_priority: bool = True
    encoder_max_lag_s: float = 0.15


class ContinuousBatcher:
    """Iteration-level scheduler in front of one engine.

    ``max_batch_rows`` bounds rows per decoder step; ``max_batch_tokens`` bounds the padded
    source and past of the running batch; ``max_queue`` bounds waiting sentences (beyond it
    ``submit`` raises :class:`QueueFull` at once rather than letting latency grow).
    """

    def __init__(
        self,
        engine: DecodeEngine,
        config: BatchingConfig | None = None,
        *,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        turn: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        encoder_share: EncoderCpuShare | None = None,
        **overrides: object,
    ) -> None:
        """``config``: the scheduling knobs (default ``BatchingConfig()``); ``overrides``:
        fields of it to replace (tests, scripts). ``turn``: several models on one device take
        turns (service/scheduling/turns.py), held around each admission and step."""
        config = replace(config or BatchingConfig(), **overrides)  # type: ignore[arg-type]
        self.config = config
        self.engine = engine
        self.metrics = metrics if metrics is not None else ServiceMetrics().for_model("default")
        self._clock = clock
        self._turn = turn
        self.policy: AdmissionPolicy
        if config.batching == "continuous":
            self.policy = ContinuousPolicy(
                IdleWait(config.max_batch_rows, config.idle_wait_s, clock)
                if config.idle_wait_s > 0
                else None
            )
        elif config.batching == "static":
            self.policy = StaticPolicy(config.max_batch_rows, config.static_max_wait_s, clock)
        else:
            raise ValueError(f"unknown batching policy {config.batching!r}")
        self.batching: BatchingPolicy = config.batching
        self.max_batch_rows = config.max_batch_rows
        self.max_queue = config.max_queue
        # How far past the head of the queue admission looks for sentences that fit the
        # running batch's width; bounded, so a sentence is overtaken only so often.
        self.admission_window = config.admission_window or 4 * config.max_batch_rows
        self.queue = SentenceQueue(config.max_queue, clock)
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        overlap = (
            EncoderOverlap(
                engine.encode,
                self.metrics,
                clock,
                idle_priority=config.encoder_idle_priority,
                max_lag_s=config.encoder_max_lag_s,
                share=encoder_share,
            )
            if config.encoder_overlap and config.batching == "continuous"
            else None
        )
        scheduler = Scheduler(
            engine,
            max_rows=config.max_batch_rows,
            max_tokens=config.max_batch_tokens,
            max_encode_tokens=config.max_admit_tokens,
            max_stall_steps=config.max_stall_steps,
            background_max_rows=config.background_max_rows,
            background_max_wait_s=config.background_max_wait_s,
            cost_tolerance=config.cost_tolerance,
            judges_cost=self.policy.judges_cost and config.cost_aware,
            encode_in_line=overlap is None,
            metrics=self.metrics,
        )
        self._loop = EngineLoop(
            engine,
            self.queue,
            self.policy,
            scheduler,
            overlap,
            self.metrics,
            idle=self._idle,
            clock=clock,
            turn=turn,
            admission_window=self.admission_window,
            track_knee=config.cost_aware,
        )

    # --- event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop.run, name="engine-loop", daemon=True)
            self._thread.start()
            overlap = self._loop.overlap is not None
            logger.info("batching: %s, encoder overlap %s", self.batching, overlap)

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
        sentences = self._put(rows, background)
        try:
            async with asyncio.timeout(timeout_s):
                return list(await asyncio.gather(*(s.future for s in sentences)))
        except BaseException:
            self.abandon(sentences)
            raise

    def submit_as_completed(
        self,
        rows: Sequence[DecodeRequest],
        timeout_s: float | None = None,
        background: bool = False,
    ) -> RowStream:
        """Queue ``rows`` now (all or none: :class:`QueueFull`, :class:`NotAccepting` raise
        here) and return an async iterator of ``(index in rows, result)`` in the order the
        rows finish. When the iteration stops early, the unfinished rows are abandoned."""
        return RowStream(self, self._put(rows, background) if rows else [], timeout_s)

    def _put(
        self, rows: Sequence[DecodeRequest], background: bool = False
    ) -> list[ScheduledSentence]:
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
