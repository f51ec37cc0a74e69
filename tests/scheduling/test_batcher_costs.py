"""Cost-aware admission: a newcomer joins when its wait outweighs what it costs the running
rows, admissions are cut to the stall bound, and the batch holds at the throughput knee."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from service.scheduling.chooser import Choice, Refusal
from tests.scheduling.batcher_helpers import (
    FakeEngine,
    GatedEngine,
    OverlapEngine,
    one_core_costs,
    sentence,
    step_until,
    wait_until,
)


@pytest.mark.anyio
async def test_a_lone_newcomer_waits_while_joining_would_cost_the_running_rows_more(make_batcher):
    """8 short rows running (about 5 steps left): one 3-token newcomer would stall them for
    its encoder call (12 ms) and merge (1 ms): 8 x 13 ms = 104 ms of their time, more than
    the ~75 ms it waits for them to drain. It joins once they have (static-like), and a
    second newcomer, arriving meanwhile, doubles the benefit: both join together."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    running = asyncio.ensure_future(
        batcher.submit([sentence(5, first=1 + 10 * i) for i in range(8)])
    )
    await wait_until(lambda: engine.active_rows == 8 and engine.waiting.is_set(), "8 running")
    lone = asyncio.ensure_future(batcher.submit([sentence(3, first=500)]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    engine.allow(2)
    await wait_until(lambda: engine.steps == 2 and engine.waiting.is_set(), "two steps")
    assert batcher.queue_depth == 1 and len(engine.admissions) == 1  # it waits
    assert batcher.metrics.admission_deferrals._value.get() > 0
    engine.allow(10**6)
    [late] = await lone
    finished = await running
    assert late.tokens == FakeEngine.expected(sentence(3, first=500).src_ids)
    assert late.admitted_step >= max(r.finished_step for r in finished) - 1


@pytest.mark.anyio
async def test_newcomers_join_at_once_when_the_running_batch_has_long_to_go(make_batcher):
    """8 long rows (about 35 steps left): the same newcomer's 13 ms stall is worth 8 x 14 ms
    of the running rows' time, far less than the ~0.5 s it would wait: it joins at once."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    running = asyncio.ensure_future(
        batcher.submit([sentence(30, first=1 + 40 * i) for i in range(8)])
    )
    await wait_until(lambda: engine.active_rows == 8 and engine.waiting.is_set(), "8 running")
    newcomer = asyncio.ensure_future(batcher.submit([sentence(3, first=500)]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    engine.allow(10**6)
    [early] = await newcomer
    await running
    assert early.admitted_step == 1


@pytest.mark.anyio
async def test_without_costs_known_every_newcomer_joins_at_the_next_step(make_batcher):
    engine = GatedEngine()  # no cost model: nothing to weigh, so nobody waits
    batcher = make_batcher(engine)
    longs = asyncio.ensure_future(batcher.submit([sentence(5, first=1 + 10 * i) for i in range(8)]))
    await wait_until(lambda: engine.active_rows == 8 and engine.waiting.is_set(), "8 running")
    engine.allow(1)
    await wait_until(lambda: engine.steps == 1 and engine.waiting.is_set(), "one step")
    newcomer = asyncio.ensure_future(batcher.submit([sentence(3, first=500)]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    engine.allow(1000)
    [late] = await newcomer
    await longs
    assert late.admitted_step == 2


@pytest.mark.anyio
async def test_an_in_line_admission_is_cut_into_chunks_that_stall_the_running_rows_little(
    make_batcher,
):
    """No spare core: one admission may stall the running rows for 2 of their steps (2 x 11
    ms). A 6-sentence paragraph of 5-token sentences is 6 x 20 ms of encoder work: it joins
    one sentence per admission, each within the bound, instead of stalling them 120 ms."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    running = asyncio.ensure_future(batcher.submit([sentence(40, first=1)]))
    await wait_until(lambda: engine.active_rows == 1 and engine.waiting.is_set(), "1 running")
    paragraph = [sentence(5, first=100 + 10 * i) for i in range(6)]
    whole = asyncio.ensure_future(batcher.submit(paragraph))
    await wait_until(lambda: batcher.queue_depth == 6, "paragraph queued")
    # at light load (submissions a second apart), no arrival is expected before the drain
    batcher.queue.interactive_arrivals.gap_s = 1.0
    engine.allow(10**6)
    results = await whole
    await running
    assert [r.tokens for r in results] == [FakeEngine.expected(r.src_ids) for r in paragraph]
    sizes = [len(ids) for _, ids in engine.admissions[1:]]
    assert sizes == [1] * 6


async def ten_queued_behind_two_running(make_batcher):
    """One core's costs; 2 long rows running (the engine holding its step) and 10 short
    one-row requests queued behind them. Returns the engine, the batcher, the running
    request, the 10 sentences and their requests."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    running = asyncio.ensure_future(batcher.submit([sentence(40, first=1), sentence(40, first=50)]))
    await wait_until(lambda: engine.active_rows == 2 and engine.waiting.is_set(), "2 running")
    crowd = [sentence(4, first=100 + 10 * i) for i in range(10)]
    waiting = [asyncio.ensure_future(batcher.submit([row])) for row in crowd]
    await wait_until(lambda: batcher.queue_depth == 10, "the crowd queued")
    return engine, batcher, running, crowd, waiting


@pytest.mark.anyio
async def test_a_batch_draining_under_load_takes_the_queue_in_one_encoder_call(make_batcher):
    """No spare core, 2 long rows running (12 ms steps: a stall bound of 24 ms) while a
    request arrives every 2 ms: 10 queued 3-token sentences (12 ms of encoder each) would
    join one at a time within the bound, or wait for the drain. As many rows wait as run,
    and more arrive every step: they join at the next step, all in one encoder call."""
    engine, batcher, running, crowd, waiting = await ten_queued_behind_two_running(make_batcher)
    batcher.queue.interactive_arrivals.gap_s = 0.002
    engine.allow(10**6)
    results = await asyncio.gather(*waiting)
    await running
    assert [r.tokens for [r] in results] == [FakeEngine.expected(r.src_ids) for r in crowd]
    assert [len(ids) for _, ids in engine.admissions] == [2, 10]
    assert {r.admitted_step for [r] in results} == {1}


@pytest.mark.anyio
async def test_at_light_load_the_same_queue_joins_within_the_stall_bound(make_batcher):
    """The same 10 sentences and 2 running rows, submissions a second apart: nobody is
    arriving behind them, so the running rows are not stalled past the bound for them."""
    engine, batcher, running, _, waiting = await ten_queued_behind_two_running(make_batcher)
    batcher.queue.interactive_arrivals.gap_s = 1.0
    engine.allow(10**6)
    await asyncio.gather(*waiting)
    await running
    assert max(len(ids) for _, ids in engine.admissions[1:]) < 10


def scheduler_choices(batcher) -> list[Choice]:
    """The choices the batcher's scheduler makes from now on, as its outputs carry them."""
    scheduler, choices = batcher._loop.scheduler, []
    schedule = scheduler.schedule

    def recorded():
        output = schedule()
        if output is not None and output.choice is not None:
            choices.append(output.choice)
        return output

    scheduler.schedule = recorded
    return choices


@pytest.mark.anyio
async def test_a_head_whose_first_sentence_alone_exceeds_the_stall_bound_is_marked_so(
    make_batcher,
):
    """One running row: 11 ms steps, so a stall bound of 22 ms. A 6-token head would stall it
    for 24 ms of encoder and 1 ms of merge, even alone: refused over the bound (which the
    engine loop's hold relies on), it joins once the running row has finished."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    choices = scheduler_choices(batcher)
    running = asyncio.ensure_future(batcher.submit([sentence(40, first=1)]))
    await wait_until(lambda: engine.active_rows == 1 and engine.waiting.is_set(), "1 running")
    head = asyncio.ensure_future(batcher.submit([sentence(6, first=100)]))
    await wait_until(lambda: batcher.queue_depth == 1, "head queued")
    batcher.queue.interactive_arrivals.gap_s = 1.0  # light load: no crowd behind the head
    engine.allow(1)
    await wait_until(lambda: engine.steps == 1 and engine.waiting.is_set(), "one step")
    assert choices[-1] == Choice.defer(Refusal.HEAD_OVER_STALL)
    engine.allow(10**6)
    [late], [long] = await asyncio.gather(head, running)
    assert late.admitted_step == long.finished_step


@pytest.mark.anyio
async def test_with_a_spare_core_the_encoder_call_is_not_charged_to_the_running_rows(
    make_batcher,
):
    """The lone newcomer of the first test, with the encoder overlapped: only the 1 ms
    merge stalls the running rows (8 ms of theirs against ~75 ms of its wait): it is encoded
    on the encoder thread at once."""
    engine = OverlapEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    running = asyncio.ensure_future(
        batcher.submit([sentence(5, first=1 + 10 * i) for i in range(8)])
    )
    await wait_until(lambda: engine.active_rows == 8 and engine.waiting.is_set(), "8 running")
    newcomer = asyncio.ensure_future(batcher.submit([sentence(3, first=500)]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    await step_until(engine, lambda: engine.encoded_on[-1:] == ["encoder_0"], "overlapped")
    engine.allow(10**6)
    [early] = await newcomer
    finished = await running
    assert early.admitted_step < max(r.finished_step for r in finished)


@pytest.mark.anyio
async def test_cost_aware_admission_holds_the_batch_at_the_throughput_knee(make_batcher):
    """tokens/s peak at 3 rows (as on a small CPU): newcomers wait in the queue rather than
    slow every running row, and join as rows finish; without the cost model all join."""
    knee = 3
    throughput = knee_at(knee)

    results = {}
    for cost_aware in (True, False):
        engine = FakeEngine()
        engine.throughput = throughput
        batcher = make_batcher(engine, admission_cost_aware=cost_aware)
        rows = [sentence(4 + index % 3, first=index * 10 + 1) for index in range(10)]
        answers = await asyncio.gather(*(batcher.submit([row]) for row in rows))
        assert [a[0].tokens for a in answers] == [FakeEngine.expected(r.src_ids) for r in rows]
        results[cost_aware] = (max(engine.rows_per_step), batcher.metrics)
    assert results[True][0] == knee
    assert results[False][0] > knee
    assert results[True][1].admission_deferrals._value.get() > 0


def knee_at(knee: int) -> Callable[[int], float]:
    """tokens/s that peak at ``knee`` rows: flat cost up to it, then steep."""
    return lambda rows: rows / (1.0 + max(0, rows - knee) ** 2)


@pytest.mark.anyio
async def test_the_sentences_of_one_request_join_the_batch_together(make_batcher):
    """At the knee (4 rows), a 3-sentence paragraph queued behind a busy batch does not
    trickle in as single rows retire: it joins whole, once 3 rows are free."""
    engine = GatedEngine()
    engine.throughput = knee_at(4)
    batcher = make_batcher(engine)
    # four running sentences that finish one per step (after 3, 4, 5 and 6 tokens)
    running = [
        asyncio.ensure_future(batcher.submit([sentence(4 + i, first=1 + 20 * i)])) for i in range(4)
    ]
    await wait_until(lambda: engine.active_rows == 4 and engine.waiting.is_set(), "4 running")
    paragraph = [sentence(6, first=200 + 10 * i) for i in range(3)]
    whole = asyncio.ensure_future(batcher.submit(paragraph))
    await wait_until(lambda: batcher.queue_depth == 3, "paragraph queued")
    engine.allow(1000)
    results = await whole
    await asyncio.gather(*running)
    assert [r.tokens for r in results] == [FakeEngine.expected(r.src_ids) for r in paragraph]
    assert len({r.admitted_step for r in results}) == 1
    # 4 running rows; the first retires after step 3, the third after step 5
    assert results[0].admitted_step == 5
    assert max(engine.rows_per_step) == 4


@pytest.mark.anyio
async def test_a_request_wider_than_the_knee_joins_sentence_by_sentence(make_batcher):
    """A unit that could never join whole (6 sentences, knee 4) is not kept waiting for
    ever: its sentences join as they fit."""
    engine = GatedEngine()
    engine.throughput = knee_at(4)
    batcher = make_batcher(engine)
    first = asyncio.ensure_future(batcher.submit([sentence(8, first=1)]))
    await wait_until(lambda: engine.active_rows == 1 and engine.waiting.is_set(), "1 running")
    paragraph = [sentence(3 + i, first=100 + 10 * i) for i in range(6)]
    whole = asyncio.ensure_future(batcher.submit(paragraph))
    await wait_until(lambda: batcher.queue_depth == 6, "paragraph queued")
    engine.allow(1000)
    results = await whole
    await first
    assert [r.tokens for r in results] == [FakeEngine.expected(r.src_ids) for r in paragraph]
    assert max(engine.rows_per_step) == 4
    assert len({r.admitted_step for r in results}) > 1


@pytest.mark.anyio
async def test_at_the_knee_a_backlog_joins_in_batches_not_row_by_row(make_batcher):
    """With the batch at its knee (6 rows) and a backlog, the single row that retires at a
    step is not replaced at once: a 5 ms merge into the batch stalls the 5 rows still running
    for more than the newcomer gains; freed rows are refilled several at a time."""
    engine = GatedEngine()
    engine.throughput = knee_at(6)
    engine.step_seconds = lambda rows: 0.010 + 0.001 * rows
    engine.encode_seconds = 0.0005
    engine.place_seconds = 0.005
    batcher = make_batcher(engine)
    # 2..6 tokens out: rows of one admission retire at different steps
    rows = [sentence(8, first=index * 12 + 1, max_new_tokens=2 + index % 5) for index in range(40)]
    answers = asyncio.gather(*(batcher.submit([row]) for row in rows))
    await wait_until(lambda: batcher.queue_depth == 34 and engine.waiting.is_set(), "backlog")
    engine.allow(10**6)
    answers = await answers
    assert [a[0].tokens for a in answers] == [
        FakeEngine.expected(r.src_ids, r.max_new_tokens) for r in rows
    ]
    assert max(engine.rows_per_step) == 6
    sizes = [len(ids) for _, ids in engine.admissions]
    assert sizes[0] == 6 and min(sizes[1:-1]) >= 2, sizes  # the last takes what is left


@pytest.mark.anyio
async def test_a_crowd_arriving_behind_a_head_refused_over_the_stall_bound_joins_at_once(
    make_batcher,
):
    """A head refused over the stall bound at light load holds the queue until the running
    row has finished; a crowd arriving behind it (a request every 2 ms) is not held: the
    head and the crowd join at the next step, in one encoder call."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine)
    choices = scheduler_choices(batcher)
    running = asyncio.ensure_future(batcher.submit([sentence(40, first=1)]))
    await wait_until(lambda: engine.active_rows == 1 and engine.waiting.is_set(), "1 running")
    head = asyncio.ensure_future(batcher.submit([sentence(6, first=100)]))
    await wait_until(lambda: batcher.queue_depth == 1, "head queued")
    batcher.queue.interactive_arrivals.gap_s = 1.0
    engine.allow(1)
    await wait_until(lambda: engine.steps == 1 and engine.waiting.is_set(), "one step")
    assert choices[-1] == Choice.defer(Refusal.HEAD_OVER_STALL)
    crowd = [
        asyncio.ensure_future(batcher.submit([sentence(4, first=200 + 10 * i)])) for i in range(4)
    ]
    await wait_until(lambda: batcher.queue_depth == 5, "the crowd queued")
    batcher.queue.interactive_arrivals.gap_s = 0.002
    engine.allow(10**6)
    joined = await asyncio.gather(head, *crowd)
    await running
    assert {result.admitted_step for [result] in joined} == {2}
    assert [len(ids) for _, ids in engine.admissions] == [1, 5]
