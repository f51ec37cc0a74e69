"""DeferralHold: when the scheduler may skip a choice because it would defer again."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from service.scheduling.admission import Deficit
from service.scheduling.chooser import Choice, Refusal
from service.scheduling.hold import RECHECK_STEPS, BatchChanges, DeferralHold


@dataclass
class FakeQueue:
    """What the hold reads of ``SentenceQueue`` (``QueueState``)."""

    version: int = 0
    arrived_rows: int = 0
    head: int | None = 7

    def head_unit(self) -> int | None:
        return self.head


def held(
    refusal: Refusal = Refusal.BACKGROUND, deficit: Deficit | None = None
) -> tuple[DeferralHold, BatchChanges, FakeQueue]:
    batch, queue = BatchChanges(), FakeQueue()
    batch.joined(4)  # four rows running
    hold = DeferralHold(batch)
    choice = Choice.defer(refusal, deficit)
    assert queue.head is not None
    hold.record(
        choice,
        head_unit=queue.head,
        queue_version=queue.version,
        step=10,
        arrived_rows=queue.arrived_rows,
    )
    return hold, batch, queue


def test_nothing_recorded_or_cleared_holds_nothing():
    hold = DeferralHold(BatchChanges())
    assert not hold.holds(0, FakeQueue())
    hold, _, queue = held()
    assert hold.holds(11, queue)
    hold.clear()
    assert not hold.holds(11, queue)


def test_any_deferral_is_looked_at_again_after_recheck_steps():
    hold, _, queue = held()
    assert hold.holds(10 + RECHECK_STEPS - 1, queue)
    assert not hold.holds(10 + RECHECK_STEPS, queue)


def test_a_plain_deferral_holds_until_the_batch_or_the_queue_changes():
    hold, batch, queue = held()
    queue.version += 1
    assert not hold.holds(11, queue)
    hold, batch, queue = held()
    batch.left(1)
    assert not hold.holds(11, queue)


def test_a_refused_head_holds_whatever_arrives_behind_it_until_the_batch_or_head_changes():
    hold, batch, queue = held(Refusal.HEAD)
    queue.version += 1  # an arrival behind the head
    queue.arrived_rows += 1
    assert hold.holds(11, queue)
    queue.head = 8
    assert not hold.holds(11, queue)
    hold, batch, queue = held(Refusal.HEAD)
    batch.left(1)
    assert not hold.holds(11, queue)


def test_a_head_over_the_stall_bound_holds_while_rows_only_leave():
    hold, batch, queue = held(Refusal.HEAD_OVER_STALL)
    batch.left(3)  # one row still running: steps only get faster, the bound only tighter
    assert hold.holds(11, queue)
    batch.joined(1)  # a wider batch steps slower: the bound widens
    assert not hold.holds(11, queue)
    hold, batch, queue = held(Refusal.HEAD_OVER_STALL)
    queue.head = 8
    assert not hold.holds(11, queue)


def test_a_budget_deferral_holds_until_the_changes_could_close_its_deficit():
    # 10 ms short; a row leaving closes 4 ms of it, a step 1 ms, a row arriving 3 ms
    deficit = Deficit(0.010, per_row_left_s=0.004, per_step_s=0.001, per_row_arrived_s=0.003)
    hold, batch, queue = held(Refusal.BUDGET, deficit)
    batch.left(2)  # 8 ms
    assert hold.holds(11, queue)  # + 1 step: 9 ms
    assert not hold.holds(12, queue)  # + 2 steps: 10 ms
    queue.arrived_rows += 1  # + 3 ms
    assert not hold.holds(11, queue)
    hold, batch, queue = held(Refusal.BUDGET, deficit)
    batch.joined(1)  # the batch it was judged against is gone
    assert not hold.holds(11, queue)


def test_a_choice_takes_newcomers_or_says_why_it_takes_none_never_both():
    with pytest.raises(ValueError):
        Choice()  # neither
    with pytest.raises(ValueError):
        Choice.defer(Refusal.BUDGET)  # a budget deferral says by how much
    deficit = Deficit(0.010, per_row_left_s=0.004, per_step_s=0.001, per_row_arrived_s=0.003)
    with pytest.raises(ValueError):
        Choice.defer(Refusal.HEAD, deficit)
    assert not Choice.defer(Refusal.BUDGET, deficit).took
