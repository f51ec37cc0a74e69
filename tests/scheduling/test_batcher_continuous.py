"""Continuous batching against static batching: who shares a decoder step, and when a
newcomer joins a running batch."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.scheduling.batcher_helpers import FakeEngine, GatedEngine, sentence, wait_until


@pytest.mark.anyio
async def test_each_sentence_gets_its_own_result_in_submission_order(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine)
    rows = [sentence(length, first=10 * index + 1) for index, length in enumerate([5, 1, 9, 3])]
    results = await batcher.submit(rows)
    assert [r.tokens for r in results] == [FakeEngine.expected(row.src_ids) for row in rows]
    assert results[1].tokens == []  # eos-only source: finished after one step, nothing generated


@pytest.mark.anyio
async def test_concurrent_requests_share_decoder_steps(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine)
    first = asyncio.ensure_future(batcher.submit([sentence(6)]))
    await wait_until(engine.waiting.is_set, "first step waiting")
    others = [asyncio.ensure_future(batcher.submit([sentence(4, first=20 + i)])) for i in range(3)]
    await wait_until(lambda: batcher.queue_depth == 3, "three queued")
    engine.allow(100)
    results = await asyncio.gather(first, *others)
    assert [r[0].tokens for r in results] == [
        FakeEngine.expected(sentence(6).src_ids),
        *(FakeEngine.expected(sentence(4, first=20 + i).src_ids) for i in range(3)),
    ]
    assert max(engine.rows_per_step) == 4  # the three latecomers joined the running batch


@pytest.mark.anyio
async def test_short_request_arriving_during_long_decode_is_admitted_and_finishes_first(
    make_batcher,
):
    engine = GatedEngine()
    batcher = make_batcher(engine)
    long_task = asyncio.ensure_future(batcher.submit([sentence(50)]))
    engine.allow(10)
    await wait_until(lambda: engine.steps == 10 and engine.waiting.is_set(), "ten long steps")

    short_task = asyncio.ensure_future(batcher.submit([sentence(3, first=100)]))
    await wait_until(lambda: batcher.queue_depth == 1, "short request queued")
    engine.allow(1000)
    [short], [long] = await asyncio.gather(short_task, long_task)

    assert long.admitted_step == 0 and long.finished_step == 49
    # The short request was queued while step 11 was under way; it joined right after it.
    assert short.admitted_step == 11
    assert short.finished_step == 13 < long.finished_step
    assert short.tokens == FakeEngine.expected(sentence(3, first=100).src_ids)


@pytest.mark.anyio
async def test_static_batch_collects_queued_requests_into_one_batch(make_batcher):
    engine = FakeEngine()
    # The wait is far longer than the test: only the third row can make the batch due.
    batcher = make_batcher(engine, batching="static", max_batch_rows=3, static_max_wait_ms=60_000)
    rows = [sentence(length, first=10 * i + 1) for i, length in enumerate([4, 7, 2])]
    tasks = [asyncio.ensure_future(batcher.submit([row])) for row in rows]
    await wait_until(lambda: engine.admissions, "the batch admitted")
    results = await asyncio.gather(*tasks)
    assert [r[0].tokens for r in results] == [FakeEngine.expected(row.src_ids) for row in rows]
    assert len(engine.admissions) == 1 and len(engine.admissions[0][1]) == 3
    assert engine.rows_per_step[0] == 3
    assert all(r[0].admitted_step == 0 for r in results)


@pytest.mark.anyio
async def test_static_batch_runs_to_the_end_before_a_newcomer_is_admitted(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine, batching="static", max_batch_rows=2, static_max_wait_ms=60_000)
    long_task = asyncio.ensure_future(batcher.submit([sentence(10)]))
    short_task = asyncio.ensure_future(batcher.submit([sentence(3, first=100)]))
    engine.allow(3)
    await wait_until(lambda: engine.steps == 3 and engine.waiting.is_set(), "three steps")
    assert engine.active_rows == 1  # the short row finished at step 2; the long one runs on

    # Two newcomers fill a batch (the wait alone would take a minute), yet neither joins
    # while a row of the static batch is still decoding, though a row is free.
    newcomers = [
        asyncio.ensure_future(batcher.submit([sentence(3, first=200 + 10 * i)])) for i in range(2)
    ]
    await wait_until(lambda: batcher.queue_depth == 2, "newcomers queued")
    engine.allow(1000)
    [long], [short] = await asyncio.gather(long_task, short_task)
    later = [result for [result] in await asyncio.gather(*newcomers)]

    assert (long.admitted_step, long.finished_step) == (0, 9)
    assert (short.admitted_step, short.finished_step) == (0, 2)
    assert [r.admitted_step for r in later] == [9, 9]  # after the batch's last row, together
    assert [r.finished_step for r in later] == [11, 11]
    assert engine.rows_per_step == [2, 2] + [1] * 7 + [2, 2]
    assert [r.tokens for r in later] == [
        FakeEngine.expected(sentence(3, first=200 + 10 * i).src_ids) for i in range(2)
    ]


@pytest.mark.anyio
async def test_continuous_admits_the_same_newcomer_at_the_next_step(make_batcher):
    """The contrast to the test above, same arrivals: the newcomer joins a running batch."""
    engine = GatedEngine()
    batcher = make_batcher(engine, max_batch_rows=2)
    long_task = asyncio.ensure_future(batcher.submit([sentence(10)]))
    await wait_until(engine.waiting.is_set, "first step waiting")
    engine.allow(3)
    await wait_until(lambda: engine.steps == 3 and engine.waiting.is_set(), "three steps")
    newcomer = asyncio.ensure_future(batcher.submit([sentence(3, first=200)]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    engine.allow(1000)
    [long], [late] = await asyncio.gather(long_task, newcomer)
    assert late.admitted_step == 4 and late.finished_step == 6 < long.finished_step == 9


@pytest.mark.anyio
async def test_static_batch_below_max_rows_starts_after_the_max_wait(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine, batching="static", max_batch_rows=64, static_max_wait_ms=20)
    [result] = await batcher.submit([sentence(5)])
    assert result.tokens == FakeEngine.expected(sentence(5).src_ids)
    assert result.queue_wait_s >= 0.02  # a lone sentence waits out the max wait


@pytest.mark.anyio
async def test_rows_finished_in_one_step_wake_the_event_loop_once(make_batcher):
    loop = asyncio.get_running_loop()
    wakeups = []
    original = loop.call_soon_threadsafe

    def counting(callback, *args, **kwargs):
        if threading.current_thread().name == "engine-loop":
            wakeups.append(callback)
        return original(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        engine = FakeEngine()
        batcher = make_batcher(engine)
        rows = [sentence(5, first=10 * index + 1) for index in range(4)]  # one length: one step
        results = await batcher.submit(rows)
    finally:
        del loop.call_soon_threadsafe
    assert [r.tokens for r in results] == [FakeEngine.expected(row.src_ids) for row in rows]
    assert len({r.finished_step for r in results}) == 1
    assert len(wakeups) == 1
