"""Results as they complete (``submit_as_completed``), as the streaming route reads them."""

from __future__ import annotations

import asyncio

import pytest

from service.errors import QueueFull
from tests.scheduling.batcher_helpers import FakeEngine, GatedEngine, sentence, wait_until


@pytest.mark.anyio
async def test_as_completed_yields_each_row_when_it_finishes_shortest_first(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine)
    rows = [sentence(9, first=1), sentence(2, first=20), sentence(5, first=40)]
    seen = [(index, result) async for index, result in batcher.submit_as_completed(rows)]
    # One token per step: the shortest source finishes first, then the middle one.
    assert [index for index, _ in seen] == [1, 2, 0]
    for index, result in seen:
        assert result.tokens == FakeEngine.expected(rows[index].src_ids)
    assert [r.finished_step for _, r in seen] == sorted(r.finished_step for _, r in seen)


@pytest.mark.anyio
async def test_as_completed_hands_out_a_result_before_the_other_rows_finish(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine)
    stream = batcher.submit_as_completed([sentence(3), sentence(30, first=10)])
    first = asyncio.ensure_future(anext(stream))
    engine.allow(2)  # two tokens: the short row is done, the long one is not
    index, result = await first
    assert index == 0 and result.tokens == FakeEngine.expected(sentence(3).src_ids)
    assert engine.active_rows == 1
    engine.allow(100)
    assert (await anext(stream))[0] == 1
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


@pytest.mark.anyio
async def test_closing_the_stream_early_drops_its_unfinished_rows_at_once(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine, max_batch_rows=1)
    stream = batcher.submit_as_completed([sentence(3), sentence(30, first=10), sentence(30)])
    first = asyncio.ensure_future(anext(stream))
    engine.allow(2)
    assert (await first)[0] == 0
    await wait_until(lambda: engine.active_rows == 1, "second row admitted")
    await stream.aclose()  # the client hung up
    assert batcher.queue_depth == 0  # the third row left the queue without running
    engine.allow(1)
    await wait_until(lambda: engine.active_rows == 0, "second row dropped from the batch")
    assert 1 in {request_id for request_id in engine.dropped}


@pytest.mark.anyio
async def test_as_completed_times_out_and_frees_the_rows(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine)
    with pytest.raises(TimeoutError):
        async for _ in batcher.submit_as_completed([sentence(20)], timeout_s=0.05):
            pass
    engine.allow(1)
    await wait_until(lambda: batcher.queue_depth == 0 and engine.active_rows == 0, "row gone")


@pytest.mark.anyio
async def test_as_completed_queues_at_once_and_a_full_queue_refuses_before_any_result(
    make_batcher,
):
    engine = GatedEngine()
    batcher = make_batcher(engine, max_queue=2)
    stream = batcher.submit_as_completed([sentence(3), sentence(4)])
    assert batcher.queue_depth + engine.active_requests == 2  # queued before iteration
    with pytest.raises(QueueFull):
        batcher.submit_as_completed([sentence(3), sentence(3), sentence(3)])
    await stream.aclose()  # never iterated: its rows are abandoned all the same
    engine.allow(1)
    await wait_until(lambda: batcher.queue_depth == 0 and engine.active_rows == 0, "rows gone")
