"""An idle engine waits for company only where a submission is expected within the wait.

Time is the batcher's injected clock, which moves only when the test moves it: the waits are
exact, and none of them depends on how fast the machine runs the engine thread."""

from __future__ import annotations

import asyncio

import pytest

from tests.scheduling.batcher_helpers import FakeClock, FakeEngine, sentence, wait_until

WAIT_MS = 300


def pass_time(batcher, clock: FakeClock, seconds: float) -> None:
    """``seconds`` pass on the batcher's clock; the engine thread, if it waits on the queue,
    looks at the clock again (as its timed wait would once that time had passed)."""
    clock.now += seconds
    with batcher.queue.cond:
        batcher.queue.cond.notify()


@pytest.mark.anyio
async def test_with_an_idle_wait_newcomers_arriving_within_it_share_one_admission(make_batcher):
    engine, clock = FakeEngine(), FakeClock()
    batcher = make_batcher(engine, clock=clock, admission_idle_wait_ms=WAIT_MS)
    batcher.queue.arrivals.gap_s = 0.05  # submissions have been coming every 50 ms
    first = asyncio.ensure_future(batcher.submit([sentence(4, first=1)]))
    await wait_until(lambda: batcher.queue_depth == 1, "the first queued")
    clock.now += 0.1
    second = asyncio.ensure_future(batcher.submit([sentence(5, first=20)]))
    await wait_until(lambda: batcher.queue_depth == 2, "the second queued")
    assert engine.admissions == []  # the first has waited 100 ms of its 300
    pass_time(batcher, clock, 0.2)
    [one], [two] = await asyncio.gather(first, second)
    assert [len(ids) for _, ids in engine.admissions] == [2]  # one encoder call for both
    assert (one.queue_wait_s, two.queue_wait_s) == pytest.approx((0.3, 0.2))
    assert one.tokens == FakeEngine.expected(sentence(4, first=1).src_ids)


@pytest.mark.anyio
async def test_an_idle_engine_waits_only_where_a_submission_is_expected_within_the_wait(
    make_batcher,
):
    """Submissions 450 ms apart on average, a 300 ms wait: company would come within it less
    often than not (49 %), so the request is admitted at once; 250 ms apart (70 %), it waits."""
    engine, clock = FakeEngine(), FakeClock()
    batcher = make_batcher(engine, clock=clock, admission_idle_wait_ms=WAIT_MS)
    batcher.queue.arrivals.gap_s = 0.45
    [at_once] = await batcher.submit([sentence(4, first=1)])
    batcher.queue.arrivals.gap_s = 0.25
    clock.now += 0.25  # the gap this submission adds keeps the average at 250 ms
    waiting = asyncio.ensure_future(batcher.submit([sentence(5, first=20)]))
    await wait_until(lambda: batcher.queue_depth == 1, "the second queued")
    pass_time(batcher, clock, 0.3)
    [waited] = await waiting
    assert at_once.queue_wait_s == 0.0
    assert waited.queue_wait_s == pytest.approx(0.3)


@pytest.mark.anyio
async def test_at_light_load_an_idle_engine_does_not_wait_for_company(make_batcher):
    """Submissions a second apart: a 300 ms idle wait would add 300 ms to every request and
    bring no company, so each is admitted at once; the gap between them is what is learned."""
    engine, clock = FakeEngine(), FakeClock()
    batcher = make_batcher(engine, clock=clock, admission_idle_wait_ms=WAIT_MS)
    assert batcher.queue.arrival_gap_s is None
    [first] = await batcher.submit([sentence(4, first=1)])  # nothing known: no wait
    clock.now += 1.0
    [second] = await batcher.submit([sentence(5, first=20)])
    assert first.queue_wait_s == second.queue_wait_s == 0.0
    assert batcher.queue.arrival_gap_s == pytest.approx(1.0)  # the gap between the two
