"""DeferralHold: when the scheduler may skip a choice because it would defer again."""

from __future__ import annotations

from dataclasses import dataclass

from service.scheduling.admission import Deficit
from service.scheduling.chooser import BatchChanges, DeferralHold


@dataclass
class FakeQueue:
    """What the hold reads of ``SentenceQueue`` (``QueueState``)."""

    version: int = 0
    arrived_rows: int = 0
    head: int | None = 7

    def head_unit(self) -> int | None:
        return self.head


def held(**deferral) -> tuple[DeferralHold, BatchChanges, FakeQueue]:
    batch, queue = BatchChanges(), FakeQueue()
    batch.joined(4)  # four rows running
    hold = DeferralHold(batch)
    kind = {"head_refused": False, "head_over_stall": False, "deficit": None, **deferral}
    queue_key = queue.head if kind["head_refused"] else queue.version
    hold.record(queue_key, step=10, arrived_rows=queue.arrived_rows, **kind)
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
    assert hold.holds(10 + DeferralHold.RECHECK_STEPS - 1, queue)
    assert not hold.holds(10 + DeferralHold.RECHECK_STEPS, queue)


def test_a_plain_deferral_holds_until_the_batch_or_the_queue_changes():
    hold, batch, queue = held()
    queue.version += 1
    assert not hold.holds(11, queue)
    hold, batch, queue = held()
    batch.left(1)
    assert not hold.holds(11, queue)


def test_a_refused_head_holds_whatever_arrives_behind_it_until_the_batch_or_head_changes():
    hold, batch, queue = held(head_refused=True)
    queue.version += 1  # an arrival behind the head
    queue.arrived_rows += 1
    assert hold.holds(11, queue)
    queue.head = 8
    assert not hold.holds(11, queue)
    hold, batch, queue = held(head_refused=True)
    batch.left(1)
    assert not hold.holds(11, queue)


def test_a_head_over_the_stall_bound_holds_while_rows_only_leave():
    hold, batch, queue = held(head_refused=True, head_over_stall=True)
    batch.left(3)  # one row still running: steps only get faster, the bound only tighter
    assert hold.holds(11, queue)
    batch.joined(1)  # a wider batch steps slower: the bound widens
    assert not hold.holds(11, queue)
    hold, batch, queue = held(head_refused=True, head_over_stall=True)
    queue.head = 8
    assert not hold.holds(11, queue)


def test_a_budget_deferral_holds_until_the_changes_could_close_its_deficit():
    # 10 ms short; a row leaving closes 4 ms of it, a step 1 ms, a row arriving 3 ms
    deficit = Deficit(0.010, per_row_left_s=0.004, per_step_s=0.001, per_row_arrived_s=0.003)
    hold, batch, queue = held(deficit=deficit)
    batch.left(2)  # 8 ms
    assert hold.holds(11, queue)  # + 1 step: 9 ms
    assert not hold.holds(12, queue)  # + 2 steps: 10 ms
    queue.arrived_rows += 1  # + 3 ms
    assert not hold.holds(11, queue)
    hold, batch, queue = held(deficit=deficit)
    batch.joined(1)  # the batch it was judged against is gone
    assert not hold.holds(11, queue)
