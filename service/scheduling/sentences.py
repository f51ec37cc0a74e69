"""A sentence in flight, from the queue to its result, and the queue it waits in.

A ``ScheduledSentence`` is what one decode row of a request is called everywhere in the scheduler:
``submit`` queues it, admission takes it, the engine decodes it (its ``row`` carries
``request_id == sentence_id``), and its future gets the ``RowResult``. The event loop and the
engine thread share only the ``SentenceQueue`` (under its condition variable) and the
futures (resolved with ``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from service.errors import NotAccepting, QueueFull
from service.runtime.types import DecodeRequest


@dataclass(frozen=True)
class RowResult:
    tokens: list[int]
    admitted_step: int  # engine.steps when the row joined the batch (before its first step)
    finished_step: int  # engine.steps after the step that finished it
    queue_wait_s: float
    hypotheses: list[list[int]] = field(default_factory=list)  # n-best (beam), best first


@dataclass(eq=False)
class ScheduledSentence:
    """One sentence from submission to result."""

    sentence_id: int
    row: DecodeRequest  # request_id == sentence_id
    future: asyncio.Future[RowResult]
    loop: asyncio.AbstractEventLoop
    enqueued_at: float = field(default_factory=time.monotonic)
    admitted_step: int = -1
    queue_wait_s: float = 0.0
    # The sentences of one ``submit`` call (a paragraph, a list of texts) form one unit,
    # admitted together where it fits: a request does not wait for its last sentence to
    # trickle into the batch (its latency is its slowest sentence's).
    unit: int = -1
    background: bool = False  # a document job's: admitted after interactive sentences
    # Plain attributes, not properties: admission reads them for every queued sentence at
    # every choice, where a property call per read is a large share of a long queue's scan.
    rows: int = field(init=False)  # 1 greedy, K beams
    src_len: int = field(init=False)  # source tokens

    def __post_init__(self) -> None:
        self.rows = self.row.beam_size
        self.src_len = len(self.row.src_ids)

    def deliver(self, result: RowResult | None, error: BaseException | None = None) -> None:
        """Resolve the future on its event loop (from any thread); inside
        :func:`one_wakeup`, when that ends, with the other results of the step."""
        pending: list[Delivery] | None = getattr(_step_deliveries, "pending", None)
        if pending is not None:
            pending.append((self, result, error))
            return
        # A closed event loop raises RuntimeError: nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.settle, result, error)

    def settle(self, result: RowResult | None, error: BaseException | None) -> None:
        """Resolve the future (on its event loop)."""
        if self.future.done():
            return  # the request was cancelled or timed out meanwhile
        if error is not None:
            self.future.set_exception(error)
        elif result is not None:
            self.future.set_result(result)


Delivery = tuple[ScheduledSentence, RowResult | None, BaseException | None]
_step_deliveries = threading.local()


@contextlib.contextmanager
def one_wakeup() -> Iterator[None]:
    """Results delivered inside reach their event loop in one callback per loop when the
    block ends: each ``call_soon_threadsafe`` writes to the loop's self-pipe and wakes it, so
    a step that finishes many rows would otherwise wake it once per row."""
    pending: list[Delivery] = []
    _step_deliveries.pending = pending
    try:
        yield
    finally:
        _step_deliveries.pending = None
        by_loop: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
        for delivery in pending:
            by_loop.setdefault(delivery[0].loop, []).append(delivery)
        for loop, deliveries in by_loop.items():
            with contextlib.suppress(RuntimeError):  # closed: nobody is waiting any more
                loop.call_soon_threadsafe(_settle_all, deliveries)


def _settle_all(deliveries: list[Delivery]) -> None:
    for sentence, result, error in deliveries:
        sentence.settle(result, error)


Units = dict[int, list[ScheduledSentence]]


class Arrivals:
    """How often submissions come and how many rows each brings: moving averages (weight 0.1)
    of the gaps between them and of their rows (the gap is None until two have come)."""

    WEIGHT = 0.1

    def __init__(self) -> None:
        self.gap_s: float | None = None
        self.rows = 1.0
        self._last: float | None = None

    def observe(self, now: float, rows: int) -> None:
        self.rows += self.WEIGHT * (rows - self.rows)
        if self._last is not None:
            gap = now - self._last
            self.gap_s = (
                gap if self.gap_s is None else self.gap_s + self.WEIGHT * (gap - self.gap_s)
            )
        self._last = now

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.gap_s if self.gap_s else 0.0


class SentenceQueue:
    """Waiting sentences, the ids to drop from the batch, and whether new work is accepted.

    Every field is guarded by ``cond``; the engine thread holds it while it chooses newcomers,
    ``submit`` and cancellations take it briefly."""

    def __init__(self, max_queue: int, clock: Callable[[], float]) -> None:
        self.max_queue = max_queue
        self.clock = clock
        self.cond = threading.Condition()
        self.waiting: deque[ScheduledSentence] = deque()
        self.to_drop: set[int] = set()
        self.accepting = True
        self.stopping = False
        self.death: BaseException | None = None  # why the engine thread died, if it did
        self._ids = itertools.count()
        # Grows whenever ``waiting`` changes: a choice made on one version of the queue holds
        # until it changes (the engine loop need not choose again at every step).
        self.version = 0
        self.arrived_rows = 0  # rows ever queued: what a budget deferral waits for
        # Every submission: whether an idle engine can expect company within its wait.
        self.arrivals = Arrivals()
        # Interactive ones: the rows that may wait for a drain an admission pushes back (a
        # document job's thousand sentences in one submission are not a rate of requests).
        self.interactive_arrivals = Arrivals()

    def __len__(self) -> int:
        return len(self.waiting)

    @property
    def arrival_gap_s(self) -> float | None:
        return self.arrivals.gap_s

    @property
    def row_rate(self) -> float:
        """Interactive rows arriving per second, recently (0 until two have come)."""
        return self.interactive_arrivals.rows_per_s

    def rows(self) -> int:
        return sum(sentence.rows for sentence in self.waiting)

    def put(
        self, rows: Sequence[DecodeRequest], background: bool = False
    ) -> list[ScheduledSentence]:
        """One sentence per row, all queued or none (:class:`QueueFull`, :class:`NotAccepting`)."""
        loop = asyncio.get_running_loop()
        now = self.clock()
        sentences: list[ScheduledSentence] = []
        for row in rows:
            sentence_id = next(self._ids)
            request = replace(row, request_id=sentence_id, src_ids=tuple(row.src_ids))
            unit = sentences[0].sentence_id if sentences else sentence_id
            future: asyncio.Future[RowResult] = loop.create_future()
            sentences.append(
                ScheduledSentence(
                    sentence_id, request, future, loop, now, unit=unit, background=background
                )
            )
        with self.cond:
            if self.death is not None:
                raise NotAccepting("engine_stopped")
            if not self.accepting:
                raise NotAccepting("shutting_down")
            # An empty queue takes any request: one within the text limits may have more
            # sentences than MT_MAX_QUEUE, and an idle server must still translate it.
            if self.waiting and len(self.waiting) + len(sentences) > self.max_queue:
                raise QueueFull(
                    f"the queue is full ({len(self.waiting)} of MT_MAX_QUEUE={self.max_queue} "
                    f"sentences waiting; this request has {len(sentences)})"
                )
            self.waiting.extend(sentences)
            self.version += 1
            arrived = sum(sentence.rows for sentence in sentences)
            self.arrived_rows += arrived
            self.arrivals.observe(now, arrived)
            if not background:
                self.interactive_arrivals.observe(now, arrived)
            self.cond.notify()
        return sentences

    def withdraw(self, sentence_ids: set[int]) -> int:
        """Remove these sentences from the queue (holds ``cond``); how many were queued. The
        others are in the batch or being admitted: the engine thread drops them."""
        before = len(self.waiting)
        self.waiting = deque(s for s in self.waiting if s.sentence_id not in sentence_ids)
        removed = before - len(self.waiting)
        self.version += 1
        if removed < len(sentence_ids):
            self.to_drop.update(sentence_ids)
        self.cond.notify()
        return removed

    def units(self, window: int) -> Units:
        """The first ``window`` + 1 queued sentences by unit, in arrival order, interactive
        ones before background ones, so a document's backlog never hides a request behind the
        window (holds ``cond``)."""
        units: Units = {}
        for sentence in itertools.islice(self._by_priority(), 0, 1 + window):
            units.setdefault(sentence.unit, []).append(sentence)
        return units

    def head_unit(self) -> int | None:
        """The unit admission tries first: the first of ``units`` (holds ``cond``)."""
        first = next(self._by_priority(), None)
        return None if first is None else first.unit

    def _by_priority(self) -> Iterator[ScheduledSentence]:
        """Waiting sentences in admission order: interactive ones, then background ones."""
        return itertools.chain(
            (s for s in self.waiting if not s.background),
            (s for s in self.waiting if s.background),
        )

    def take(self, chosen: list[ScheduledSentence]) -> list[ScheduledSentence]:
        """Chosen sentences leave the queue (holds ``cond``); those abandoned while they were
        chosen (no longer queued) are left out."""
        ids = {sentence.sentence_id for sentence in chosen}
        queued = {sentence.sentence_id for sentence in self.waiting}
        self.waiting = deque(s for s in self.waiting if s.sentence_id not in ids)
        self.version += 1
        self.to_drop -= ids
        return [sentence for sentence in chosen if sentence.sentence_id in queued]

    def drain(self) -> list[ScheduledSentence]:
        """Every queued sentence leaves (holds ``cond``): shutdown or death."""
        leftovers = list(self.waiting)
        self.waiting.clear()
        self.version += 1
        return leftovers
