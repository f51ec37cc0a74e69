"""A request's life in the batcher beyond success: a full queue, a timeout, a cancellation,
an engine failure, a refused row, shutdown; and the metrics it counts."""

from __future__ import annotations

import asyncio

import pytest

from service.errors import EngineFailure, InvalidRow, NotAccepting, QueueFull
from tests.scheduling.batcher_helpers import (
    FakeEngine,
    GatedEngine,
    SlowEngine,
    sentence,
    wait_until,
)


@pytest.mark.anyio
async def test_full_queue_refuses_at_once(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine, max_queue=2)
    running = asyncio.ensure_future(batcher.submit([sentence(3)]))
    await wait_until(engine.waiting.is_set, "engine busy")
    queued = asyncio.ensure_future(batcher.submit([sentence(3), sentence(3)]))
    await wait_until(lambda: batcher.queue_depth == 2, "queue full")
    with pytest.raises(QueueFull, match="MT_MAX_QUEUE=2"):
        await batcher.submit([sentence(3)])
    assert batcher.metrics.queue_depth._value.get() == 2
    engine.allow(100)
    await asyncio.gather(running, queued)


@pytest.mark.anyio
async def test_an_empty_queue_takes_a_request_of_more_sentences_than_max_queue(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine, max_queue=2)
    running = asyncio.ensure_future(batcher.submit([sentence(3)]))
    await wait_until(engine.waiting.is_set, "engine busy")
    whole = asyncio.ensure_future(batcher.submit([sentence(3) for _ in range(5)]))
    await wait_until(lambda: batcher.queue_depth == 5, "all five queued")
    with pytest.raises(QueueFull):  # a non-empty queue still has its bound
        await batcher.submit([sentence(3)])
    engine.allow(100)
    assert len(await whole) == 5
    await running


def test_an_unset_max_queue_holds_a_maximal_text_of_the_shortest_sentences():
    from service.scheduling.settings import BatchingSettings
    from service.text.limits import TextLimits

    limits = TextLimits()
    queue = BatchingSettings().queue_for(limits.max_chars_per_text).max_queue
    assert queue is not None and queue * 3 >= limits.max_chars_per_text  # "A. " * n
    assert BatchingSettings(max_queue=9).queue_for(limits.max_chars_per_text).max_queue == 9


@pytest.mark.anyio
async def test_timeout_drops_the_rows_from_the_engine(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine)
    with pytest.raises(TimeoutError):
        await batcher.submit([sentence(20)], timeout_s=0.05)
    # Queued or already in the batch when time ran out: either way it must be gone once
    # the step in progress ends (the gate lets exactly one more step run).
    engine.allow(1)
    await wait_until(lambda: engine.steps >= 1 or engine.admissions == [], "step ended")
    await wait_until(lambda: batcher.queue_depth == 0 and engine.active_rows == 0, "row gone")


@pytest.mark.anyio
async def test_cancelled_request_leaves_the_queue_and_the_batch(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine)
    running = asyncio.ensure_future(batcher.submit([sentence(20)]))
    await wait_until(engine.waiting.is_set, "engine busy")
    queued = asyncio.ensure_future(batcher.submit([sentence(20, first=40)]))
    await wait_until(lambda: batcher.queue_depth == 1, "queued")
    queued.cancel()
    running.cancel()
    await asyncio.gather(queued, running, return_exceptions=True)
    assert batcher.queue_depth == 0
    engine.allow(1)
    await wait_until(lambda: engine.dropped == [0], "running row dropped")
    assert engine.active_rows == 0


@pytest.mark.anyio
async def test_engine_failure_fails_the_batch_and_the_batcher_recovers(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine)
    engine.fail_next_step = True
    # The exception's type, not its text (which may carry paths and ends up in a response).
    with pytest.raises(EngineFailure, match=r"failed during decoding \(RuntimeError\)") as failed:
        await batcher.submit([sentence(4)])
    assert "device lost" not in str(failed.value)
    [result] = await batcher.submit([sentence(4)])
    assert result.tokens == FakeEngine.expected(sentence(4).src_ids)


@pytest.mark.anyio
async def test_a_row_the_engine_refuses_fails_alone(make_batcher):
    engine = FakeEngine()
    bad = sentence(5, first=500)
    engine.reject_sources.add(tuple(bad.src_ids))
    batcher = make_batcher(engine)
    good = [sentence(4, first=10), sentence(6, first=40)]
    outcomes = await asyncio.gather(
        batcher.submit([good[0]]),
        batcher.submit([bad]),
        batcher.submit([good[1]]),
        return_exceptions=True,
    )
    assert isinstance(outcomes[1], InvalidRow) and "refused by the test" in str(outcomes[1])
    assert outcomes[0][0].tokens == FakeEngine.expected(good[0].src_ids)
    assert outcomes[2][0].tokens == FakeEngine.expected(good[1].src_ids)


@pytest.mark.anyio
async def test_shutdown_finishes_in_flight_work_and_refuses_new(make_batcher):
    engine = GatedEngine()
    batcher = make_batcher(engine)
    running = asyncio.ensure_future(batcher.submit([sentence(5)]))
    await wait_until(engine.waiting.is_set, "engine busy")
    batcher.begin_shutdown()
    with pytest.raises(NotAccepting):
        await batcher.submit([sentence(3)])
    engine.allow(100)
    assert await batcher.shutdown(grace_s=30) is True
    [result] = await running
    assert result.tokens == FakeEngine.expected(sentence(5).src_ids)


@pytest.mark.anyio
async def test_shutdown_after_the_grace_fails_what_is_left(make_batcher):
    engine = SlowEngine()
    batcher = make_batcher(engine)
    endless = asyncio.ensure_future(batcher.submit([sentence(10_000)]))  # 10k slow steps
    await wait_until(lambda: engine.steps > 0, "decoding")
    assert await batcher.shutdown(grace_s=0.01) is False
    with pytest.raises(NotAccepting):
        await endless
    assert engine.dropped == [0]


@pytest.mark.anyio
async def test_metrics_count_steps_rows_and_tokens(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine)
    await batcher.submit([sentence(4), sentence(6, first=20)])
    registry = batcher.metrics.registry
    assert registry.get_sample_value("mt_decode_steps_total") == engine.steps == 5
    assert registry.get_sample_value("mt_generated_tokens_total") == 3 + 5
    assert registry.get_sample_value("mt_batch_rows_sum") == sum(engine.rows_per_step)
    assert registry.get_sample_value("mt_batch_rows_count") == 5
    assert registry.get_sample_value("mt_queue_wait_seconds_count") == 2
