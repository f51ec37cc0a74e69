"""The latency budget of admission on its own (service/scheduling/admission.py): the drain
time, the deficit a newcomer runs and what closes it, and the arrival rate it is fed."""

from __future__ import annotations

import asyncio

import pytest

from service.runtime.types import BatchEstimate
from tests.scheduling.batcher_helpers import sentence


def test_the_drain_time_shrinks_with_the_rows_still_running():
    """Two rows, 2 and 4 steps left, 10 ms steps: two full steps, then two with half the rows
    (5 ms each, above the 30 % fixed share); a lone row's steps never go below that share."""
    from service.scheduling.admission import LatencyBudget, RunningRow

    budget = LatencyBudget()
    running = [RunningRow(1, 4), RunningRow(1, 2)]
    assert budget.drain_s(0.010, running) == pytest.approx(0.030)
    many = [RunningRow(1, 1)] * 9 + [RunningRow(1, 3)]
    assert budget.drain_s(0.010, many) == pytest.approx(0.010 + 2 * 0.003)


def test_rows_left_queued_count_the_drain_a_newcomer_pushes_back():
    """One row with 5 steps left, 10 ms steps; a newcomer of 20 steps stalls it 2 ms and
    slows its steps by 1 ms. Alone, its 5-step wait outweighs that and it joins. With three
    rows queued behind it that wait for the drain (the encoder runs in line), joining pushes
    that drain from 50 ms to the newcomer's last step, for each of them: it waits."""
    from service.scheduling.admission import LatencyBudget, RunningRow

    budget = LatencyBudget()
    now = BatchEstimate(rows=1, padded_tokens=0, step_s=0.010)
    joined = BatchEstimate(rows=2, padded_tokens=0, step_s=0.011)
    running = [RunningRow(1, 5)]
    assert budget.deficit(now, joined, 0.002, running, 1, newcomer_steps=20) is None
    deferred = budget.deficit(now, joined, 0.002, running, 1, 20, queued_rows=3)
    assert deferred is not None
    drain_after = 0.002 + budget.drain_s(0.011, [*running, RunningRow(1, 20)])
    cost = 0.002 + 0.001 * 5 + 3 * (drain_after - 0.050)
    assert deferred.seconds == pytest.approx(cost - 0.050)


def test_where_rows_stay_queued_those_arriving_before_the_drain_wait_for_it_too():
    """The newcomer of the test above. With one row left queued and rows arriving at 40 a
    second, two more come before the 50 ms drain; the batch cannot take what is queued now,
    so they wait for that drain as the queued row does: the deficit of three queued rows.
    Where the admission takes everyone queued, arrivals may join later as it did: at 60 a
    second the newcomer still joins."""
    from service.scheduling.admission import LatencyBudget, RunningRow

    budget = LatencyBudget()
    now = BatchEstimate(rows=1, padded_tokens=0, step_s=0.010)
    joined = BatchEstimate(rows=2, padded_tokens=0, step_s=0.011)
    running = [RunningRow(1, 5)]
    queued = budget.deficit(now, joined, 0.002, running, 1, 20, queued_rows=3)
    arriving = budget.deficit(
        now, joined, 0.002, running, 1, 20, queued_rows=1, arriving_rows_per_s=40.0
    )
    assert queued is not None and arriving is not None
    assert arriving.seconds == pytest.approx(queued.seconds)
    assert budget.deficit(now, joined, 0.002, running, 1, 20, arriving_rows_per_s=60.0) is None


def test_the_queue_learns_the_rate_at_which_interactive_rows_arrive():
    """Two-sentence paragraphs every 50 ms: 40 rows a second, from moving averages of the
    gap between submissions and of the rows in each. A document job's 500 sentences arriving
    meanwhile are no such rate: they count for the idle wait's gap, not for the row rate."""
    from service.scheduling.sentences import SentenceQueue

    now = [0.0]
    queue = SentenceQueue(max_queue=10_000, clock=lambda: now[0])
    assert queue.row_rate == 0.0  # nothing known before two submissions

    async def submit(document_at: int | None = None) -> None:
        for index in range(80):
            queue.put([sentence(4, first=1), sentence(5, first=20)])
            if index == document_at:
                queue.put([sentence(3, first=40)] * 500, background=True)
            now[0] += 0.05

    asyncio.run(submit())
    assert queue.row_rate == pytest.approx(40.0, rel=0.01)
    assert queue.arrival_gap_s == pytest.approx(0.05, rel=0.01)
    asyncio.run(submit(document_at=70))
    assert queue.row_rate == pytest.approx(40.0, rel=0.01)
    assert queue.arrival_gap_s < 0.05  # the document was a submission too


def test_a_budget_deficit_closes_only_as_far_as_judging_again_would_join():
    """Eight rows, 5 steps left each, 18 ms steps; a newcomer would stall them 21 ms and
    slow 4 shared steps by 1 ms: it costs 8 x 25 ms = 200 ms of theirs against ~90 ms of its
    own wait. The deficit, 110 ms, closes 25 ms per row that leaves (its share of the cost),
    8 ms per step (every row's shared steps shorten) and 90 ms per row that arrives (one
    more newcomer's wait): whatever it says, judging the changed batch again agrees."""
    from service.scheduling.admission import LatencyBudget, RunningRow

    budget = LatencyBudget()
    now = BatchEstimate(rows=8, padded_tokens=0, step_s=0.018)
    joined = BatchEstimate(rows=9, padded_tokens=0, step_s=0.019)

    def deficit(rows: int, newcomers: int = 1):
        running = [RunningRow(1, 5)] * rows
        return budget.deficit(now, joined, 0.021, running, newcomers, newcomer_steps=4)

    first = deficit(8)
    assert first is not None
    assert first.seconds == pytest.approx(8 * 0.025 - 5 * 0.018)
    assert (first.per_row_left_s, first.per_step_s) == pytest.approx((0.025, 0.008))
    assert first.per_row_arrived_s == pytest.approx(5 * 0.018)
    for rows_left in range(8):
        closed = first.closed_by(rows_left, steps=0, rows_arrived=0)
        assert closed == (rows_left >= 5)
        assert (deficit(8 - rows_left) is None) <= closed  # it never joins while held
    assert not first.closed_by(0, steps=0, rows_arrived=1)
    assert first.closed_by(0, steps=0, rows_arrived=2)
    assert deficit(8, newcomers=3) is None  # three newcomers' waits outweigh the cost
    assert first.closed_by(0, steps=14, rows_arrived=0)
