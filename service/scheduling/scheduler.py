"""The engine thread's scheduler: every decision of a step boundary, made in one place.

Like vLLM v1's ``Scheduler``, it keeps the running sentences and answers the engine loop's two
calls (service/scheduling/engine_loop.py carries out what they say)::

    schedule()  wait for work, then one complete ``SchedulerOutput``: the running sentences
                to drop, the newcomers taken from the queue, where their encoder call runs
                (in line, or overlapped on the encoder thread: service/scheduling/overlap.py),
                and whether an admission encoded on the encoder thread joins and is waited for
    update()    the sentences a step finished leave the batch and get their results

Who joins is the ``AdmissionChooser``'s (service/scheduling/chooser.py); *when* admission is
open is the policy's (``MT_BATCHING``):

``ContinuousPolicy`` (default)
    Admission is open at every step; the latency budget (service/scheduling/admission.py)
    decides whether a filled admission joins now or waits for the batch to drain. Where the
    encoder runs in line (one core) an idle engine first waits for company, as static batching
    does (``IdleWait``), where submissions come at least once a wait: there a newcomer
    arriving just after an admission rarely joins it (its encoder call would stall the running
    rows), so it shares an encoder call and the narrow steps of a small batch only by arriving
    before the admission.
``StaticPolicy``
    The request-level "dynamic batcher" of Triton and most serving stacks, kept as a baseline
    to measure the continuous policy against (``python -m loadtest compare``). While the
    engine is idle, queued sentences wait until ``max_batch_rows`` rows are queued or the
    oldest has waited ``max_wait_s`` (``MT_STATIC_MAX_WAIT_MS``, like Triton's
    ``max_queue_delay_microseconds``); then one batch is admitted (same row and token
    budgets) and stepped until every row in it has finished, with admission closed.

A choice that deferred every queued unit is held (``DeferralHold``, service/scheduling/
hold.py): ``schedule`` skips choosing again while its outcome is known.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.metrics import ServiceMetrics
from service.runtime.types import FinishedRequest
from service.scheduling.chooser import COST_TOLERANCE, AdmissionChooser, Choice
from service.scheduling.engine_api import CostedEngine
from service.scheduling.hold import BatchChanges, DeferralHold
from service.scheduling.overlap import EncoderOverlap
from service.scheduling.sentences import RowResult, ScheduledSentence, SentenceQueue, Units
from service.scheduling.settings import BatchingPolicy, BatchingSettings
from service.scheduling.timeline import PhaseClock, thread_cpu


class EncoderCall(enum.Enum):
    """Where an admission's encoder call runs."""

    IN_LINE = "in line"  # on the engine thread, the running rows waiting
    OVERLAPPED = "overlapped"  # on the encoder thread; the newcomers join once it is done


@dataclass(frozen=True)
class SchedulerOutput:
    """One step boundary, decided: the engine loop carries it out as it stands."""

    dropped: list[int]  # running sentences that leave first (cancelled, timed out)
    newcomers: list[ScheduledSentence]  # taken from the queue: they join at this boundary
    encoder: EncoderCall  # where the newcomers' encoder call runs
    # An admission is on the encoder thread: it joins at this boundary if its call is done,
    # waited for where nothing runs meanwhile (``await_encoder``; otherwise only where it
    # lags: ``EncoderOverlap.lagging``, the overlap's own safety bound).
    encoded_joins: bool
    await_encoder: bool
    busy: bool  # newcomers, running rows or an encoder call: the loop takes a turn
    # The admission chooser's answer, whole (who joins, or why nobody does); None where no
    # choice was made (nothing queued, the last deferral holds, admission closed, or an
    # admission still encoding).
    choice: Choice | None


# The knee (``mt_row_limit``) is estimated again every this many steps.
KNEE_EVERY_STEPS = 16
# How far past the head of the queue admission looks for sentences that fit the running
# batch's width, in batches of ``max_batch_rows``: bounded, so a sentence is overtaken only
# so often.
ADMISSION_WINDOW_BATCHES = 4


class Scheduler:
    """Plans each step boundary and keeps the running sentences (engine thread only)."""

    def __init__(
        self,
        engine: CostedEngine,
        queue: SentenceQueue,
        config: BatchingSettings,
        overlap: EncoderOverlap | None,
        metrics: ServiceMetrics,
        *,
        phases: PhaseClock,
        idle: threading.Event,
        clock: Callable[[], float],
    ) -> None:
        """``overlap``: the encoder thread, where newcomers may be encoded (None: in line)."""
        self.engine = engine
        self.queue = queue
        self.config = config
        self.overlap = overlap
        self.metrics = metrics
        self.phases = phases
        self.idle = idle  # set while there is no work at all
        self.idle_wait_s = config.idle_wait_s(overlap is not None)
        self.policy = admission_policy(config, self.idle_wait_s, clock)
        self.admission_window = ADMISSION_WINDOW_BATCHES * config.max_batch_rows
        self.chooser = AdmissionChooser(
            engine,
            config,
            judges_cost=self.policy.judges_cost and config.admission_cost_aware,
            encode_in_line=overlap is None,
            metrics=metrics,
            clock=clock,
        )
        self.running: dict[int, ScheduledSentence] = {}
        self.batch_changes = BatchChanges()
        # the last choice, where it deferred everyone: choosing again is skipped while it holds
        self.hold = DeferralHold(self.batch_changes)

    # --- schedule ---------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput | None:
        """Wait for work; this boundary's plan (None: the engine loop stops)."""
        queue, overlap = self.queue, self.overlap
        with self.phases.phase("schedule"):
            with queue.cond:
                self._wait_for_work()
                if queue.stopping:
                    return None
                dropped = [i for i in queue.to_drop if i in self.running]
                # ids of an admission still being encoded are dropped once it has joined
                encoding = overlap.in_flight if overlap is not None else None
                in_flight = encoding.sentence_ids if encoding is not None else set()
                queue.to_drop = {i for i in queue.to_drop if i in in_flight}
                version, arrived_rows, row_rate = queue.version, queue.arrived_rows, queue.row_rate
                units = self._units(dropped) if encoding is None else {}
            staying = [s for i, s in self.running.items() if i not in dropped]
            choice: Choice | None = None
            newcomers: list[ScheduledSentence] = []
            if units:
                with thread_cpu(self.metrics.admission_choice_cpu):
                    choice = self.chooser.choose(list(units.values()), staying, row_rate)
                self.hold.record(
                    choice,
                    head_unit=next(iter(units)),
                    queue_version=version,
                    step=self.engine.steps,
                    arrived_rows=arrived_rows,
                )
            if choice is not None and choice.took:
                with queue.cond:
                    newcomers = queue.take(list(choice.newcomers))
                    self.metrics.queue_depth.set(len(queue))
        return SchedulerOutput(
            dropped,
            newcomers,
            EncoderCall.OVERLAPPED if overlap is not None and staying else EncoderCall.IN_LINE,
            encoded_joins=encoding is not None,
            await_encoder=not staying,
            busy=bool(newcomers or staying or encoding is not None),
            choice=choice,
        )

    def _wait_for_work(self) -> None:
        """Until rows run, an encoder call is in flight, sentences are to drop, the loop is to
        stop or the queue may enter (the caller holds the queue's ``cond``)."""
        queue = self.queue
        while not (self.running or self._encoding or queue.to_drop or queue.stopping):
            if not queue.waiting:
                self.idle.set()
                with self.phases.phase("idle"):
                    queue.cond.wait()
            elif (wait_s := self.policy.wait_s(queue)) > 0:
                with self.phases.phase("wait"):
                    queue.cond.wait(wait_s)  # a submit wakes it earlier
            else:
                break

    @property
    def _encoding(self) -> bool:
        return self.overlap is not None and self.overlap.in_flight is not None

    def _units(self, dropped: Sequence[int]) -> Units:
        """The queued units to choose from at this boundary: none while the last deferral
        holds or the policy keeps admission closed (the caller holds the queue's ``cond``)."""
        queue = self.queue
        running_rows = sum(s.rows for i, s in self.running.items() if i not in dropped)
        # a crowd joins whatever the last choice was
        crowd = self.chooser.may_be_crowded(len(queue), running_rows, queue.row_rate)
        if self.running and not dropped and not crowd and self.hold.holds(self.engine.steps, queue):
            return {}
        if not self.policy.open(queue, running_rows):
            return {}
        return queue.units(self.admission_window)

    # --- the running sentences --------------------------------------------------------------

    def joined(self, sentence: ScheduledSentence) -> None:
        """``sentence`` runs from this step on."""
        self.running[sentence.sentence_id] = sentence
        self.batch_changes.joined(sentence.rows)

    def remove(self, sentence_ids: Sequence[int]) -> None:
        """Sentences leave the batch without a result (dropped, or failed)."""
        for sentence_id in sentence_ids:
            sentence = self.running.pop(sentence_id, None)
            self.batch_changes.left(sentence.rows if sentence is not None else 0)

    def update(self, finished: list[FinishedRequest]) -> None:
        """The sentences the step finished leave the batch and get their results."""
        finished_step, metrics = self.engine.steps, self.metrics
        for done in finished:
            sentence = self.running.pop(done.request_id, None)  # type: ignore[call-overload]
            if sentence is None:
                continue  # dropped meanwhile
            self.batch_changes.left(sentence.rows)
            tokens = list(done.tokens)
            self.chooser.lengths.observe(sentence.src_len, done.steps)
            metrics.generated_tokens.inc(len(tokens))
            metrics.sentences.inc()
            sentence.deliver(
                RowResult(
                    tokens,
                    sentence.admitted_step,
                    finished_step,
                    sentence.queue_wait_s,
                    list(done.hypotheses),
                )
            )
        if self.config.admission_cost_aware and finished_step % KNEE_EVERY_STEPS == 0:
            knee = self.engine.estimate((), self.config.max_batch_rows, COST_TOLERANCE)
            metrics.row_limit.set(knee.row_limit or 0)


# --- when admission is open -------------------------------------------------------------------


class AdmissionPolicy(Protocol):
    name: BatchingPolicy
    # Whether admissions are judged by cost (knee, stall bound, latency budget): a static
    # batch is admitted whole by the row and token budgets alone.
    judges_cost: bool

    def wait_s(self, queue: SentenceQueue) -> float:
        """Seconds until the queue may enter an idle engine (the queue is not empty)."""
        ...

    def open(self, queue: SentenceQueue, running_rows: int) -> bool:
        """Whether queued sentences may join at this step."""
        ...


def admission_policy(
    config: BatchingSettings, idle_wait_s: float, clock: Callable[[], float]
) -> AdmissionPolicy:
    """The policy ``config.batching`` names; ``idle_wait_s``: the continuous policy's wait
    for company while the engine is idle (``BatchingSettings.idle_wait_s``)."""
    if config.batching == "continuous":
        return ContinuousPolicy(
            IdleWait(config.max_batch_rows, idle_wait_s, clock) if idle_wait_s > 0 else None
        )
    return StaticPolicy(config.max_batch_rows, config.static_max_wait_s, clock)


class IdleWait:
    """While the engine is idle: how long queued sentences still wait for company, until
    ``max_rows`` rows are queued or the oldest has waited ``max_wait_s``."""

    def __init__(self, max_rows: int, max_wait_s: float, clock: Callable[[], float]) -> None:
        self.max_rows = max_rows
        self.max_wait_s = max_wait_s
        self._clock = clock

    def wait_s(self, queue: SentenceQueue) -> float:
        if self.max_wait_s <= 0 or queue.rows() >= self.max_rows:
            return 0.0
        due = queue.waiting[0].enqueued_at + self.max_wait_s
        return max(0.0, due - self._clock())


class ContinuousPolicy:
    name: BatchingPolicy = "continuous"
    judges_cost = True

    def __init__(self, idle_wait: IdleWait | None = None) -> None:
        self._idle_wait = idle_wait  # None: an idle engine admits at once

    # The idle wait applies where submissions come at least this often, in waits: one
    # submission expected within it (with Poisson arrivals, company 63 % of the time). Below
    # that, as at half of one core's capacity (a submission every 12 ms against a 10 ms wait),
    # the core has room, and the wait costs the requests that find the engine idle more than
    # the shared encoder call saves them; above it the wait gathers each admission.
    COMPANY_GAP_WAITS = 1.0

    def wait_s(self, queue: SentenceQueue) -> float:
        idle_wait, gap = self._idle_wait, queue.arrival_gap_s
        if idle_wait is None or gap is None or gap > self.COMPANY_GAP_WAITS * idle_wait.max_wait_s:
            return 0.0
        return idle_wait.wait_s(queue)

    def open(self, queue: SentenceQueue, running_rows: int) -> bool:
        return len(queue) > 0


class StaticPolicy:
    name: BatchingPolicy = "static"
    judges_cost = False

    def __init__(self, max_rows: int, max_wait_s: float, clock: Callable[[], float]) -> None:
        self._idle_wait = IdleWait(max_rows, max_wait_s, clock)

    def wait_s(self, queue: SentenceQueue) -> float:
        return self._idle_wait.wait_s(queue)

    def open(self, queue: SentenceQueue, running_rows: int) -> bool:
        """Only into an idle engine, once the batch is due: the running batch takes no one
        until all of its rows have finished."""
        return len(queue) > 0 and running_rows == 0 and self.wait_s(queue) <= 0
