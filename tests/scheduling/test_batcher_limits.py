"""The batch's limits: rows (beams count as rows), the padded-token budget with the running
past length, and the window that keeps a wide sentence from widening the batch."""

from __future__ import annotations

import asyncio

import pytest

from service.scheduling.hold import RECHECK_STEPS
from tests.scheduling.batcher_helpers import FakeEngine, GatedEngine, sentence, wait_until


@pytest.mark.anyio
async def test_rows_per_step_stay_within_max_batch_rows(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine, max_batch_rows=4)
    rows = [sentence(2 + index % 5, first=index * 10 + 1) for index in range(13)]
    results = await asyncio.gather(*(batcher.submit([row]) for row in rows))
    assert [r[0].tokens for r in results] == [FakeEngine.expected(row.src_ids) for row in rows]
    assert max(engine.rows_per_step) == 4


@pytest.mark.anyio
async def test_beams_count_as_rows(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine, max_batch_rows=8)
    tasks = [asyncio.ensure_future(batcher.submit([sentence(3, beam_size=4)])) for _ in range(3)]
    await wait_until(lambda: batcher.queue_depth < 3, "admission")
    engine.allow(100)
    await asyncio.gather(*tasks)
    assert max(engine.rows_per_step) == 8  # two sentences of 4 beams, never three


@pytest.mark.anyio
async def test_padded_token_budget_limits_admission(make_batcher):
    engine = FakeEngine()
    # rows x longest source <= 24: three 8-token sentences fit, a fourth waits.
    batcher = make_batcher(engine, max_batch_tokens=24)
    rows = [sentence(8, first=10 * i + 1) for i in range(5)]
    results = await batcher.submit(rows)
    assert [r.tokens for r in results] == [FakeEngine.expected(row.src_ids) for row in rows]
    assert max(engine.rows_per_step) == 3


@pytest.mark.anyio
async def test_sentence_over_the_token_budget_still_runs_when_the_batch_is_empty(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine, max_batch_tokens=16)
    [result] = await batcher.submit([sentence(40)])
    assert result.tokens == FakeEngine.expected(sentence(40).src_ids)


@pytest.mark.anyio
async def test_window_admission_skips_a_widening_sentence_for_narrow_ones(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine, max_batch_rows=3)
    first = asyncio.ensure_future(batcher.submit([sentence(6)]))
    await wait_until(engine.waiting.is_set, "first step waiting")
    head = asyncio.ensure_future(batcher.submit([sentence(4, first=50)]))
    wide = asyncio.ensure_future(batcher.submit([sentence(30, first=100)]))
    narrow = asyncio.ensure_future(batcher.submit([sentence(5, first=200)]))
    await wait_until(lambda: batcher.queue_depth == 3, "all queued")
    engine.allow(1)
    await wait_until(lambda: len(engine.admissions) == 2, "second admission")
    # Two free rows: the head, then the narrow sentence, which does not widen the padded
    # batch beyond 6; the wide one, queued earlier, waits for the next free row.
    assert engine.widths_per_step[-1] == 6
    engine.allow(1)
    await wait_until(lambda: engine.steps == 2, "step 2")
    assert engine.widths_per_step[-1] == 6
    assert len(engine.admissions[1][1]) == 2
    engine.allow(1000)
    results = await asyncio.gather(first, head, wide, narrow)
    assert results[2][0].admitted_step > results[3][0].admitted_step


@pytest.mark.anyio
async def test_token_budget_counts_the_running_past_length(make_batcher):
    """Newcomers are padded to the batch's past length P: rows x (S + P) is what the budget
    bounds, so a newcomer that fits by source alone waits while P is large."""
    engine = GatedEngine()
    batcher = make_batcher(engine, max_batch_tokens=100)
    long_task = asyncio.ensure_future(batcher.submit([sentence(30)]))
    await wait_until(engine.waiting.is_set, "first step waiting")
    engine.past_len = 40  # 2 x (20 + 40) > 100
    newcomer = asyncio.ensure_future(batcher.submit([sentence(5, first=300)]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    engine.allow(3)
    await wait_until(lambda: engine.steps == 3 and engine.waiting.is_set(), "three steps")
    assert batcher.queue_depth == 1
    engine.past_len = 10  # 2 x (20 + 10) <= 100
    engine.allow(1000)
    [late] = await newcomer
    [long] = await long_task
    # The fake shrinks P with no row leaving (the engine's P shrinks only when rows leave,
    # which has the queue looked at again at once): the deferral made at the first boundary
    # is looked at again after RECHECK_STEPS.
    assert late.admitted_step == 1 + RECHECK_STEPS < long.finished_step
