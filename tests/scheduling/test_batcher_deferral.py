"""When the engine loop chooses again after a deferral or a refused head of the queue."""

from __future__ import annotations

import asyncio

import pytest

from service.scheduling.chooser import Choice, Refusal
from service.scheduling.hold import RECHECK_STEPS
from tests.scheduling.batcher_helpers import (
    FakeEngine,
    GatedEngine,
    a_running_row_and_a_newcomer,
    one_core_costs,
    sentence,
    step_until,
    wait_until,
)


@pytest.mark.anyio
async def test_a_deferral_holds_until_the_queue_or_the_batch_changes(make_batcher):
    """Choosing costs a good share of a step on one core: once every queued unit was deferred,
    the engine loop chooses again only when a sentence arrives, joins or leaves, or after
    ``RECHECK_STEPS`` steps."""
    engine = GatedEngine()
    batcher = make_batcher(engine)
    scheduler = batcher._loop.scheduler
    chooser, recheck = scheduler.chooser, RECHECK_STEPS
    chooser_choose, calls, defer = chooser.choose, [], [True]

    def choose(units, staying, row_rate=0.0):
        calls.append(engine.steps)
        if defer[0] and staying:
            return Choice.defer(Refusal.BACKGROUND)
        return chooser_choose(units, staying, row_rate)

    chooser.choose = choose  # type: ignore[method-assign]
    long_task, waiting_task = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(80), sentence(3, first=100), steps_first=2
    )
    engine.allow(40)
    await wait_until(lambda: engine.steps == 42 and engine.waiting.is_set(), "40 more steps")
    deferred = [step for step in calls if step >= 2]
    # the first choice at step 3, then one each RECHECK_STEPS steps: not one per step
    assert deferred == [3, 3 + recheck, 3 + 2 * recheck], calls

    other_task = asyncio.ensure_future(batcher.submit([sentence(4, first=200)]))
    await wait_until(lambda: batcher.queue_depth == 2, "another unit queued")
    engine.allow(1)
    await wait_until(lambda: len(calls) == len(deferred) + 2, "a choice for the newcomer")
    assert calls[-1] == 43  # the queue changed: chosen again at once

    defer[0] = False
    engine.allow(10**6)
    [waited], [other], [long] = await asyncio.gather(waiting_task, other_task, long_task)
    assert waited.tokens == FakeEngine.expected(sentence(3, first=100).src_ids)
    # the deferral made at step 43 held for its RECHECK_STEPS, then both joined
    assert waited.admitted_step == other.admitted_step == 43 + recheck
    assert other.admitted_step < long.finished_step


def refuse_the_head_while_rows_run(batcher, engine, over_stall: bool = False) -> list[int]:
    """Replace the admission chooser's choice: while rows run the head is refused (over the
    stall bound where ``over_stall``), into an empty batch everyone joins. Returns the steps
    at which it was asked, as it is asked."""
    chooser, calls = batcher._loop.scheduler.chooser, []

    def choose(units, staying, row_rate=0.0):
        calls.append(engine.steps)
        if staying:
            return Choice.defer(Refusal.HEAD_OVER_STALL if over_stall else Refusal.HEAD)
        return Choice.take([s for unit in units for s in unit])

    chooser.choose = choose
    return calls


@pytest.mark.anyio
async def test_a_head_that_cannot_join_is_not_reconsidered_for_what_arrives_behind_it(
    make_batcher,
):
    """Where the head of the queue could not join, nothing behind it joins first: arrivals
    behind it do not make the engine loop choose again, a change of head does."""
    engine = GatedEngine()
    batcher = make_batcher(engine)
    calls = refuse_the_head_while_rows_run(batcher, engine)
    long_task, head_task = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(80), sentence(3, first=100), steps_first=2
    )
    engine.allow(1)
    await wait_until(lambda: engine.steps == 3 and engine.waiting.is_set(), "the head refused")
    assert calls[-1] == 3
    behind_task = asyncio.ensure_future(batcher.submit([sentence(4, first=200)]))
    await wait_until(lambda: batcher.queue_depth == 2, "a unit behind the head")
    engine.allow(5)
    await wait_until(lambda: engine.steps == 8 and engine.waiting.is_set(), "five more steps")
    assert calls[-1] == 3  # the arrival behind the refused head changed nothing

    head_task.cancel()  # the head leaves the queue: the new head is looked at
    await wait_until(lambda: batcher.queue_depth == 1, "the head withdrawn")
    engine.allow(1)
    await wait_until(lambda: engine.steps == 9 and engine.waiting.is_set(), "one more step")
    assert calls[-1] == 9
    behind_task.cancel()
    engine.allow(10**6)
    await long_task


@pytest.mark.anyio
@pytest.mark.parametrize("over_stall", [False, True])
async def test_a_head_refused_over_the_stall_bound_is_not_reconsidered_as_rows_leave(
    make_batcher, over_stall
):
    """A head refused because encoding it would stall the running rows past the bound is not
    looked at again when a row leaves (fewer rows step faster: the bound only tightens); a
    head refused for anything else is. Both join once the batch has drained."""
    engine = GatedEngine()
    batcher = make_batcher(engine)
    calls = refuse_the_head_while_rows_run(batcher, engine, over_stall=over_stall)
    running_task = asyncio.ensure_future(batcher.submit([sentence(40), sentence(4, first=300)]))
    engine.allow(1)
    await wait_until(lambda: engine.steps == 1 and engine.waiting.is_set(), "two rows decoding")
    head_task = asyncio.ensure_future(batcher.submit([sentence(3, first=100)]))
    await wait_until(lambda: batcher.queue_depth == 1, "a head queued")
    engine.allow(1)
    await wait_until(lambda: engine.steps == 2 and engine.waiting.is_set(), "the head refused")
    refused_at = calls[-1]
    engine.allow(8)  # the short running row finishes meanwhile
    await wait_until(lambda: engine.steps == 10 and engine.waiting.is_set(), "eight more steps")
    assert engine.rows_per_step[-1] == 1
    if over_stall:
        assert calls[-1] == refused_at  # a row leaving changed nothing
    else:
        assert refused_at < calls[-1] < 10  # chosen again once the row had left
    engine.allow(10**6)
    [head], [long, short] = await asyncio.gather(head_task, running_task)
    assert short.finished_step < long.finished_step == head.admitted_step
    assert head.tokens == FakeEngine.expected(sentence(3, first=100).src_ids)


@pytest.mark.anyio
async def test_a_budget_deferral_is_not_judged_again_while_nothing_could_close_it(make_batcher):
    """Seven rows of 5 steps and one of 3: a 5-token newcomer would cost them far more than
    it waits (the test above). The short row leaving after two steps changes the batch but
    closes a quarter of the deficit at most: the deferral holds, so the newcomer is judged
    once, not at every boundary, and joins the drained batch (one deferral in all)."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    rows = [sentence(5, first=1 + 10 * i) for i in range(7)] + [sentence(3, first=90)]
    running = asyncio.ensure_future(batcher.submit(rows))
    await wait_until(lambda: engine.active_rows == 8 and engine.waiting.is_set(), "8 running")
    newcomer = asyncio.ensure_future(batcher.submit([sentence(5, first=500)]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    await step_until(engine, lambda: engine.active_rows == 7, "the short row left")
    engine.allow(10**6)
    [late] = await newcomer
    finished = await running
    assert late.tokens == FakeEngine.expected(sentence(5, first=500).src_ids)
    assert late.admitted_step >= max(r.finished_step for r in finished)
    assert batcher.metrics.admission_deferrals._value.get() == 1
