"""An idle engine waits for company only where a submission is expected within the wait."""

from __future__ import annotations

import asyncio

import pytest

from tests.scheduling.batcher_helpers import FakeEngine, sentence, wait_until


@pytest.mark.anyio
async def test_with_an_idle_wait_newcomers_arriving_within_it_share_one_admission(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine, admission_idle_wait_ms=300)
    batcher.queue.arrivals.gap_s = 0.05  # submissions have been coming every 50 ms
    first = asyncio.ensure_future(batcher.submit([sentence(4, first=1)]))
    await wait_until(lambda: batcher.queue_depth == 1, "the first queued")
    second = asyncio.ensure_future(batcher.submit([sentence(5, first=20)]))
    [one], [two] = await asyncio.gather(first, second)
    assert [len(ids) for _, ids in engine.admissions] == [2]  # one encoder call for both
    assert one.queue_wait_s >= 0.29 and two.queue_wait_s <= one.queue_wait_s  # the first waited
    assert one.tokens == FakeEngine.expected(sentence(4, first=1).src_ids)


@pytest.mark.anyio
async def test_an_idle_engine_waits_only_where_a_submission_is_expected_within_the_wait(
    make_batcher,
):
    """Submissions 450 ms apart on average, a 300 ms wait: company would come within it less
    often than not (49 %), so the request is admitted at once; 250 ms apart (70 %), it waits."""
    engine = FakeEngine()
    batcher = make_batcher(engine, admission_idle_wait_ms=300)
    batcher.queue.arrivals.gap_s = 0.45
    [at_once] = await batcher.submit([sentence(4, first=1)])
    batcher.queue.arrivals.gap_s = 0.25
    [waited] = await batcher.submit([sentence(5, first=20)])
    assert at_once.queue_wait_s < 0.1 and waited.queue_wait_s >= 0.29


@pytest.mark.anyio
async def test_at_light_load_an_idle_engine_does_not_wait_for_company(make_batcher):
    """Submissions a second apart: a 300 ms idle wait would add 300 ms to every request and
    bring no company, so each is admitted at once; the gap between them is what is learned."""
    engine = FakeEngine()
    batcher = make_batcher(engine, admission_idle_wait_ms=300)
    assert batcher.queue.arrival_gap_s is None
    [first] = await batcher.submit([sentence(4, first=1)])  # nothing known: no wait
    batcher.queue.arrivals.gap_s = 1.0
    [second] = await batcher.submit([sentence(5, first=20)])
    assert first.queue_wait_s < 0.1 and second.queue_wait_s < 0.1
    assert batcher.queue.arrival_gap_s > 0.9  # a moving average of the gaps seen
