"""When queued sentences may join the batch: the continuous and static policies (``MT_BATCHING``).

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from service.scheduling.sentences import SentenceQueue

BatchingPolicy = Literal["continuous", "static"]


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
