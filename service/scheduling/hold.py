"""Whether choosing again would only defer again.

On one core a choice costs a sizeable part of a step, and under load most step boundaries
defer every queued unit. ``DeferralHold`` keeps the last ``Choice`` that took nobody
(service/scheduling/chooser.py) with what it depended on, so the scheduler
(service/scheduling/scheduler.py) skips choices whose outcome is known. By its ``Refusal``:

- ``BUDGET`` (deferred by the latency budget): until the rows that left, the steps taken and
  the rows that arrived since could have closed its ``Deficit``, or a row joined;
- ``HEAD_OVER_STALL`` (the head of the queue refused over the stall bound): until a row joins
  or the head changes (rows leaving make steps faster and only tighten the bound; an empty
  batch takes the head whatever it costs, and the scheduler chooses whenever nothing runs);
- ``HEAD`` (the head refused for anything else): until the batch or the head changes (nothing
  arriving behind it changes that);
- ``BACKGROUND`` (any other deferral): until the batch or the queue changes;

and never for more than ``RECHECK_STEPS`` steps (background units age; the output-length
estimates move).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from service.scheduling.admission import Deficit
from service.scheduling.chooser import Choice, Refusal

# A deferral is looked at again after this many steps whatever changed.
RECHECK_STEPS = 16


class QueueState(Protocol):
    """What the hold reads of the queue (``SentenceQueue``, under its ``cond``)."""

    version: int  # grows with every arrival and withdrawal
    arrived_rows: int  # rows ever queued

    def head_unit(self) -> int | None: ...


@dataclass
class BatchChanges:
    """Running counts of what changed the running batch (engine thread)."""

    version: int = 0  # grows whenever a sentence joins or leaves the batch
    rows_left: int = 0  # rows that ever left it (finished or dropped)
    rows_joined: int = 0  # rows that ever joined it

    def joined(self, rows: int) -> None:
        self.version += 1
        self.rows_joined += rows

    def left(self, rows: int) -> None:
        self.version += 1
        self.rows_left += rows


@dataclass(frozen=True)
class Deferral:
    """What a choice that deferred every queued unit depended on."""

    refusal: Refusal
    deficit: Deficit | None  # ``Refusal.BUDGET``: how far from joining
    queue: int | None  # the queue's version, or its head unit where the head was refused
    batch: BatchChanges  # the batch's counts then (a copy)
    step: int
    arrived_rows: int  # ``SentenceQueue.arrived_rows`` then


class DeferralHold:
    """The last choice, where it deferred everyone, and whether it still holds."""

    def __init__(self, batch: BatchChanges) -> None:
        self._batch = batch
        self._last: Deferral | None = None

    def record(
        self, choice: Choice, *, head_unit: int, queue_version: int, step: int, arrived_rows: int
    ) -> None:
        """What ``choice`` (made at ``step`` on the queue as it was then: its ``head_unit``,
        ``queue_version`` and ``arrived_rows``) depended on; a choice that took someone
        clears the hold."""
        if choice.refusal is None:
            self.clear()
            return
        head_refused = choice.refusal in (Refusal.HEAD, Refusal.HEAD_OVER_STALL)
        self._last = Deferral(
            choice.refusal,
            choice.deficit,
            head_unit if head_refused else queue_version,
            replace(self._batch),
            step,
            arrived_rows,
        )

    def clear(self) -> None:
        """Nothing holds (a choice took someone)."""
        self._last = None

    def holds(self, step: int, queue: QueueState) -> bool:
        """Whether choosing again at ``step`` would defer again (module docstring; the caller
        holds the queue's ``cond`` and has rows running)."""
        deferred, batch = self._last, self._batch
        if deferred is None or step - deferred.step >= RECHECK_STEPS:
            return False
        then, refusal = deferred.batch, deferred.refusal
        if refusal is Refusal.BUDGET:
            assert deferred.deficit is not None
            return batch.rows_joined == then.rows_joined and not deferred.deficit.closed_by(
                batch.rows_left - then.rows_left,
                step - deferred.step,
                queue.arrived_rows - deferred.arrived_rows,
            )
        if refusal is Refusal.HEAD_OVER_STALL:
            return batch.rows_joined == then.rows_joined and deferred.queue == queue.head_unit()
        if batch.version != then.version:
            return False
        return deferred.queue == (queue.head_unit() if refusal is Refusal.HEAD else queue.version)
