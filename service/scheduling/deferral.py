"""When choosing again would only defer again: the engine loop's hold on a deferral.

On one core a choice costs a sizeable part of a step, and under load most step boundaries
defer every queued unit. ``DeferralHold`` keeps what the last deferral depended on and answers whether it
still holds, so the engine loop skips choices whose outcome is known:

- deferred by the latency budget: until the rows that left, the steps taken and the rows that
  arrived since could have closed its ``Deficit``, or a row joined;
- the head of the queue refused over the stall bound: until a row joins or the head changes
  (rows leaving make steps faster and only tighten the bound; an empty batch takes the head
  whatever it costs, and the engine loop chooses whenever nothing runs);
- the head refused for anything else: until the batch or the head changes (nothing arriving
  behind it changes that);
- any other deferral: until the batch or the queue changes;

and never for more than ``RECHECK_STEPS`` steps (background units age; the output-length
estimates move).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from service.scheduling.admission import Deficit


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

    queue: int | None  # the queue's version, or its head unit where the head was refused
    head_refused: bool
    head_over_stall: bool  # the head was refused over the stall bound (``AdmissionChooser``)
    batch: BatchChanges  # the batch's counts then (a copy)
    step: int
    deficit: Deficit | None  # deferred by the latency budget: how far from joining
    arrived_rows: int  # ``SentenceQueue.arrived_rows`` then


class DeferralHold:
    """The last choice, where it deferred everyone, and whether it still holds."""

    RECHECK_STEPS = 16

    def __init__(self, batch: BatchChanges) -> None:
        self._batch = batch
        self._last: Deferral | None = None

    def record(
        self,
        queue: int | None,
        *,
        head_refused: bool,
        head_over_stall: bool,
        step: int,
        deficit: Deficit | None,
        arrived_rows: int,
    ) -> None:
        """A choice deferred every queued unit (``queue``: the queue's version, or its head
        unit where the head was refused)."""
        self._last = Deferral(
            queue, head_refused, head_over_stall, replace(self._batch), step, deficit, arrived_rows
        )

    def clear(self) -> None:
        """A choice took someone: nothing holds."""
        self._last = None

    def holds(self, step: int, queue: QueueState) -> bool:
        """Whether choosing again at ``step`` would defer again (module docstring; the caller
        holds the queue's ``cond`` and has rows running)."""
        deferred, batch = self._last, self._batch
        if deferred is None or step - deferred.step >= self.RECHECK_STEPS:
            return False
        then = deferred.batch
        if deferred.deficit is not None and not deferred.head_refused:
            return batch.rows_joined == then.rows_joined and not deferred.deficit.closed_by(
                batch.rows_left - then.rows_left,
                step - deferred.step,
                queue.arrived_rows - deferred.arrived_rows,
            )
        if deferred.head_over_stall:
            return batch.rows_joined == then.rows_joined and deferred.queue == queue.head_unit()
        if batch.version != then.version:
            return False
        return deferred.queue == (queue.head_unit() if deferred.head_refused else queue.version)
