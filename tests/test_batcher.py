"""The continuous batcher's scheduling, against a deterministic fake engine.

The fake's "translation" of a sentence is its source ids reversed (eos left out), one token
per step, so every result and every step count is known in advance. Tests that need the
engine to hold still use a gate: each decoder step waits for a permit from the test.
Nothing here asserts on wall time.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

import pytest

from service.errors import EngineFailure, InvalidRow, NotAccepting, QueueFull
from service.runtime.engine import BatchEstimate, DecodeRequest, FinishedRequest, RejectedRequest
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.overlap import EncoderCpuShare

EOS = 0


@dataclass
class FakeEncoded:
    requests: list[DecodeRequest]
    rejected: list[RejectedRequest] = field(default_factory=list)

    @property
    def request_ids(self) -> list[Hashable]:
        return [request.request_id for request in self.requests]


class FakePlan:
    """``Engine.plan`` for the fake: the estimate over what was taken and the newcomers."""

    def __init__(self, engine: FakeEngine, max_rows: int, tolerance: float) -> None:
        self._engine = engine
        self._max_rows = max_rows
        self._tolerance = tolerance
        self._taken: list[tuple[int, int]] = []

    def estimate(self, newcomers) -> BatchEstimate:
        return self._engine.estimate([*self._taken, *newcomers], self._max_rows, self._tolerance)

    def take(self, newcomers) -> None:
        self._taken.extend(newcomers)


class FakeEngine:
    """Same interface as ``service.runtime.engine.Engine``; records what the batcher asked of it."""

    def __init__(self) -> None:
        self.steps = 0
        self.decoder_seconds = 0.0
        # request id -> (request, its whole "translation", tokens produced so far)
        self._active: dict[Hashable, tuple[DecodeRequest, list[int], list[int]]] = {}
        self.admissions: list[tuple[int, list[Hashable]]] = []  # (steps at add, ids)
        self.rows_per_step: list[int] = []
        self.widths_per_step: list[int] = []
        self.dropped: list[Hashable] = []
        self.fail_next_step = False
        self.past_len = 0  # what every row of the batch is padded to (one group)
        # rows -> tokens/s, standing in for the engine's step-cost model (None: not fitted)
        self.throughput: Callable[[int], float] | None = None
        self.reject_sources: set[tuple[int, ...]] = set()  # add() refuses these alone
        self.encoded_on: list[str] = []  # the thread of each encoder call
        # Costs, standing in for the engine's cost models (None: not fitted): seconds of a step
        # of so many rows, of encoding one source token, of merging newcomers into the batch.
        self.step_seconds: Callable[[int], float] | None = None
        self.encode_seconds = 0.0
        self.place_seconds = 0.0

    @staticmethod
    def expected(src_ids: Iterable[int], max_new_tokens: int = 10**9) -> list[int]:
        return [token for token in reversed(list(src_ids)) if token != EOS][:max_new_tokens]

    @property
    def active_requests(self) -> int:
        return len(self._active)

    @property
    def active_rows(self) -> int:
        return sum(request.beam_size for request, _, _ in self._active.values())

    @property
    def groups(self) -> int:
        return 1 if self._active else 0

    def add(self, requests: list[DecodeRequest]) -> list[RejectedRequest]:
        rejected = []
        for request in requests:
            if tuple(request.src_ids) in self.reject_sources:
                rejected.append(RejectedRequest(request.request_id, "refused by the test"))
                continue
            target = self.expected(request.src_ids, request.max_new_tokens)
            self._active[request.request_id] = (request, target, [])
        self.admissions.append((self.steps, [request.request_id for request in requests]))
        return rejected

    def encode(self, requests: list[DecodeRequest]) -> FakeEncoded:
        self.encoded_on.append(threading.current_thread().name)
        return FakeEncoded(list(requests))

    def place(self, encoded: FakeEncoded) -> None:
        encoded.rejected = self.add(encoded.requests)

    def plan(self, max_rows: int = 64, tolerance: float = 0.0) -> FakePlan:
        return FakePlan(self, max_rows, tolerance)

    def estimate(self, newcomers=(), max_rows: int = 64, tolerance: float = 0.0) -> BatchEstimate:
        rows = self.active_rows + sum(count for count, _ in newcomers)
        width = max(
            [len(r.src_ids) for r, _, _ in self._active.values()]
            + [length for _, length in newcomers],
            default=0,
        )
        costs = {}
        if self.step_seconds is not None:
            costs = {
                "step_s": self.step_seconds(rows),
                "encode_s": self.encode_seconds * sum(length for _, length in newcomers),
                "place_s": self.place_seconds if newcomers and self._active else 0.0,
            }
        if self.throughput is None:
            return BatchEstimate(rows, rows * (width + self.past_len), **costs)
        rates = [self.throughput(count) for count in range(1, max_rows + 1)]
        limit = max(c for c, rate in enumerate(rates, 1) if rate >= max(rates) * (1 - tolerance))
        return BatchEstimate(rows, rows * (width + self.past_len), row_limit=limit, **costs)

    def step(self) -> list[FinishedRequest]:
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("device lost")
        self.steps += 1
        self.rows_per_step.append(self.active_rows)
        self.widths_per_step.append(max(len(r.src_ids) for r, _, _ in self._active.values()))
        finished = []
        for request_id, (_, target, produced) in list(self._active.items()):
            if len(produced) < len(target):
                produced.append(target[len(produced)])
            if len(produced) == len(target):
                finished.append(FinishedRequest(request_id, produced, len(produced)))
                del self._active[request_id]
        return finished

    def drop(self, request_ids: Iterable[Hashable]) -> None:
        for request_id in request_ids:
            if self._active.pop(request_id, None) is not None:
                self.dropped.append(request_id)


class GatedEngine(FakeEngine):
    """Each step waits for a permit, so a test decides when the engine moves."""

    def __init__(self) -> None:
        super().__init__()
        self.permits = threading.Semaphore(0)
        self.waiting = threading.Event()  # set while a step waits for its permit

    def step(self) -> list[FinishedRequest]:
        self.waiting.set()
        self.permits.acquire()
        self.waiting.clear()
        return super().step()

    def allow(self, steps: int = 1) -> None:
        for _ in range(steps):
            self.permits.release()


class SlowEngine(FakeEngine):
    """A millisecond per step: a long sentence outlasts a short shutdown grace."""

    def step(self) -> list[FinishedRequest]:
        time.sleep(0.001)
        return super().step()


def sentence(length: int, first: int = 1, **options) -> DecodeRequest:
    """A source of ``length`` ids ending in eos."""
    return DecodeRequest(src_ids=tuple(range(first, first + length - 1)) + (EOS,), **options)


async def wait_until(predicate, what: str) -> None:
    """Yield to the engine thread until ``predicate()`` holds (a bounded number of times)."""
    for _ in range(5000):
        if predicate():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def make_batcher():
    batchers: list[ContinuousBatcher] = []

    def make(engine, **limits) -> ContinuousBatcher:
        limits.setdefault("batching", "continuous")  # not whatever MT_BATCHING says
        # encoder calls in line (the engine thread) unless a test asks for the encoder thread
        limits.setdefault("encoder_overlap", isinstance(engine, OverlapEngine))
        # an idle engine admits at once unless a test asks for the idle wait
        limits.setdefault("admission_idle_wait_ms", 0.0)
        batcher = ContinuousBatcher(engine, **limits)
        batcher.start()
        batchers.append(batcher)
        return batcher

    yield make
    for batcher in batchers:
        if isinstance(batcher.engine, GatedEngine):
            batcher.engine.allow(10**6)
        batcher.close()


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
async def test_a_deferral_holds_until_the_queue_or_the_batch_changes(make_batcher):
    """Choosing costs a good share of a step on one core: once every queued unit was deferred,
    the engine loop chooses again only when a sentence arrives, joins or leaves, or after
    ``RECHECK_STEPS`` steps."""
    engine = GatedEngine()
    batcher = make_batcher(engine)
    loop = batcher._loop
    scheduler_choose, calls, defer = loop.scheduler.choose, [], [True]

    def choose(units, staying, row_rate=0.0):
        calls.append(engine.steps)
        return [] if defer[0] and staying else scheduler_choose(units, staying, row_rate)

    loop.scheduler.choose = choose  # type: ignore[method-assign]
    long_task, waiting_task = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(80), sentence(3, first=100), steps_first=2
    )
    engine.allow(40)
    await wait_until(lambda: engine.steps == 42 and engine.waiting.is_set(), "40 more steps")
    deferred = [step for step in calls if step >= 2]
    # the first choice at step 3, then one each RECHECK_STEPS steps: not one per step
    assert deferred == [3, 3 + loop.hold.RECHECK_STEPS, 3 + 2 * loop.hold.RECHECK_STEPS], calls

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
    assert waited.admitted_step == other.admitted_step == 43 + loop.hold.RECHECK_STEPS
    assert other.admitted_step < long.finished_step


def refuse_the_head_while_rows_run(batcher, engine, over_stall: bool = False) -> list[int]:
    """Replace the scheduler's choice: while rows run the head is refused (over the stall
    bound where ``over_stall``), into an empty batch everyone joins. Returns the steps at
    which it was asked, as it is asked."""
    scheduler, calls = batcher._loop.scheduler, []

    def choose(units, staying, row_rate=0.0):
        calls.append(engine.steps)
        scheduler.head_refused = bool(staying)
        scheduler.head_over_stall = over_stall and bool(staying)
        return [] if staying else [s for unit in units for s in unit]

    scheduler.choose = choose
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


# --- the static ("wait for a batch, run it to the end") policy -------------------------------


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


def test_the_fakes_offer_every_method_the_batcher_calls():
    from service.scheduling.batcher import DecodeEngine

    for fake in (FakeEngine(), GatedEngine(), OverlapEngine()):
        assert isinstance(fake, DecodeEngine), type(fake).__name__


def test_unknown_batching_policy_is_refused():
    with pytest.raises(ValueError, match="batching"):
        ContinuousBatcher(FakeEngine(), batching="eager")


class FakeClock:
    """A clock the test moves by hand (admission waits without wall-clock asserts)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def one_core_costs(engine: FakeEngine) -> None:
    """Costs as on one core, where the encoder runs in line: a 10 ms step (+1 ms a row),
    4 ms of encoder per source token, 1 ms to merge newcomers into the batch."""
    engine.step_seconds = lambda rows: 0.010 + 0.001 * rows
    engine.encode_seconds = 0.004
    engine.place_seconds = 0.001


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
    batcher = make_batcher(engine, max_stall_steps=2.0)
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


@pytest.mark.anyio
async def test_a_head_whose_first_sentence_alone_exceeds_the_stall_bound_is_marked_so(
    make_batcher,
):
    """One running row: 11 ms steps, so a stall bound of 22 ms. A 6-token head would stall it
    for 24 ms of encoder and 1 ms of merge, even alone: refused over the bound (which the
    engine loop's hold relies on), it joins once the running row has finished."""
    engine = GatedEngine()
    one_core_costs(engine)
    batcher = make_batcher(engine, max_stall_steps=2.0)
    scheduler = batcher._loop.scheduler
    running = asyncio.ensure_future(batcher.submit([sentence(40, first=1)]))
    await wait_until(lambda: engine.active_rows == 1 and engine.waiting.is_set(), "1 running")
    head = asyncio.ensure_future(batcher.submit([sentence(6, first=100)]))
    await wait_until(lambda: batcher.queue_depth == 1, "head queued")
    engine.allow(1)
    await wait_until(lambda: engine.steps == 1 and engine.waiting.is_set(), "one step")
    assert scheduler.head_refused and scheduler.head_over_stall
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
    assert late.admitted_step == 1 + batcher._loop.hold.RECHECK_STEPS < long.finished_step


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
        batcher = make_batcher(engine, admission_cost_aware=cost_aware, cost_tolerance=0.0)
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
    batcher = make_batcher(engine, cost_tolerance=0.0)
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
    batcher = make_batcher(engine, cost_tolerance=0.0)
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
    batcher = make_batcher(engine, cost_tolerance=0.0)
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


def test_the_batcher_takes_the_settings_batching_group_as_it_is():
    from service.config import Settings
    from service.scheduling.scheduler import MAX_STALL_STEPS

    settings = Settings(max_batch_rows=7, admission_cost_aware=False)
    batcher = ContinuousBatcher(FakeEngine(), settings.scheduling)
    assert batcher.config is settings.scheduling
    assert (batcher.max_batch_rows, batcher.config.admission_cost_aware) == (7, False)
    assert batcher._loop.scheduler.max_stall_steps == MAX_STALL_STEPS  # a fixed bound


@pytest.mark.parametrize(
    ("cpus", "idle_wait_ms", "expected_s"),
    [(1, None, 0.010), (2, None, 0.0), (2, 5.0, 0.005), (1, 0.0, 0.0)],
)
def test_an_idle_engine_waits_for_company_only_where_the_encoder_runs_in_line(
    monkeypatch, cpus, idle_wait_ms, expected_s
):
    """On one CPU a newcomer arriving just after an admission rarely joins it, so an idle
    engine waits as long as static batching would; with an encoder thread it does not."""
    from service import wiring
    from service.config import Settings
    from service.runtime.cpus import CpuBudget

    monkeypatch.setattr(wiring, "cpu_budget", lambda: CpuBudget(cpus, cpus, None, "affinity"))
    settings = Settings(static_max_wait_ms=10.0, admission_idle_wait_ms=idle_wait_ms)
    batcher = ContinuousBatcher(FakeEngine(), settings.scheduling, spare_core=wiring.spare_core())
    assert (batcher._loop.overlap is not None) == (cpus >= 2)
    assert batcher.idle_wait_s == pytest.approx(expected_s)


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


def test_engine_threads_leave_the_event_loop_a_core_unless_set(monkeypatch):
    import os

    from service.config import Settings

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert Settings().model.engine_threads == 3
    assert Settings(intra_op_threads=4).model.engine_threads == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert Settings().model.engine_threads == 1  # never 0: that would be ONNX Runtime's own choice


# --- results as they complete (streaming) -----------------------------------------------------


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


# --- encoder overlap ---------------------------------------------------------------------------


class OverlapEngine(GatedEngine):
    """``add`` in two halves, as the real engine: ``encode`` (on the batcher's encoder thread
    when rows are running) can be held back or made to fail; ``place`` joins the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.release_encoder = threading.Event()
        self.release_encoder.set()
        self.fail_sources: set[tuple[int, ...]] = set()

    def encode(self, requests: list[DecodeRequest]) -> FakeEncoded:
        self.encoded_on.append(threading.current_thread().name)
        self.release_encoder.wait(10)
        if any(tuple(request.src_ids) in self.fail_sources for request in requests):
            raise RuntimeError("encoder blew up")
        return FakeEncoded(list(requests))


async def a_running_row_and_a_newcomer(
    batcher, engine, running_row, newcomer_row, steps_first: int = 0
):
    """``running_row`` decodes (held after ``steps_first`` steps); ``newcomer_row`` then waits
    in the queue. Returns both submissions' tasks."""
    running = asyncio.ensure_future(batcher.submit([running_row]))
    engine.allow(steps_first)
    await wait_until(
        lambda: engine.steps == steps_first and engine.waiting.is_set(), "first row decoding"
    )
    newcomer = asyncio.ensure_future(batcher.submit([newcomer_row]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    return running, newcomer


@pytest.mark.anyio
async def test_a_failed_encoding_on_the_encoder_thread_fails_its_admission_alone(make_batcher):
    engine = OverlapEngine()
    batcher = make_batcher(engine)
    bad = sentence(3, first=50)
    engine.fail_sources.add(tuple(bad.src_ids))
    running, failing = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(8, first=1), bad
    )
    engine.allow(10**6)
    with pytest.raises(EngineFailure, match=r"failed to encode the input \(RuntimeError\)"):
        await failing
    [result] = await running
    assert result.tokens == FakeEngine.expected(sentence(8, first=1).src_ids)
    # into the empty batch the first row was added whole (nothing to overlap with); the
    # newcomer, with a row running, was encoded on the encoder thread
    first, encoder_thread = engine.encoded_on
    assert first == "engine-loop"  # the first row, into an empty batch: in line
    assert encoder_thread.startswith("encoder")


@pytest.mark.anyio
async def test_a_request_cancelled_while_encoding_leaves_once_it_has_joined(make_batcher):
    engine = OverlapEngine()
    batcher = make_batcher(engine)
    engine.release_encoder.clear()  # the next encoder call waits
    running, newcomer = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(30, first=1), sentence(20, first=40)
    )
    engine.allow(2)  # the admission goes to the encoder thread; the running row steps on
    await wait_until(lambda: len(engine.encoded_on) == 2, "newcomer encoding")
    await wait_until(lambda: engine.steps >= 2, "running row stepped while encoding")
    newcomer.cancel()
    await asyncio.gather(newcomer, return_exceptions=True)
    engine.release_encoder.set()
    engine.allow(10**6)
    [result] = await running
    assert result.tokens == FakeEngine.expected(sentence(30, first=1).src_ids)
    await wait_until(lambda: 1 in engine.dropped, "cancelled newcomer dropped after joining")
    assert engine.active_rows == 0


class PolicyRecordingEngine(OverlapEngine):
    """Records the OS scheduling policy of the thread each encoder call runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder_policies: list[int] = []

    def encode(self, requests: list[DecodeRequest]) -> FakeEncoded:
        self.encoder_policies.append(os.sched_getscheduler(0))
        return super().encode(requests)


async def one_overlapped_encoding(batcher, engine: OverlapEngine) -> None:
    """A newcomer encoded on the encoder thread while a row runs; both translated."""
    running, newcomer = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(30, first=1), sentence(5, first=100)
    )
    await step_until(
        engine, lambda: engine.encoded_on == ["engine-loop", "encoder_0"], "overlapped encoding"
    )
    engine.allow(10**6)
    assert (await newcomer)[0].tokens == FakeEngine.expected(sentence(5, first=100).src_ids)
    assert (await running)[0].tokens == FakeEngine.expected(sentence(30, first=1).src_ids)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
@pytest.mark.parametrize("idle", [True, False])
@pytest.mark.anyio
async def test_the_encoder_thread_runs_at_idle_priority_unless_told_not_to(make_batcher, idle):
    engine = PolicyRecordingEngine()
    batcher = make_batcher(engine, encoder_idle_priority=idle)
    await one_overlapped_encoding(batcher, engine)
    assert engine.encoder_policies == [os.SCHED_OTHER, os.SCHED_IDLE if idle else os.SCHED_OTHER]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the test's own thread is untouched


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
@pytest.mark.anyio
async def test_a_refused_idle_priority_is_logged_and_the_encoder_thread_still_works(
    make_batcher, monkeypatch, caplog
):
    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    engine = PolicyRecordingEngine()
    batcher = make_batcher(engine)
    await one_overlapped_encoding(batcher, engine)
    assert engine.encoder_policies == [os.SCHED_OTHER, os.SCHED_OTHER]
    assert "SCHED_IDLE refused" in caplog.text


@pytest.mark.anyio
async def test_an_encoder_call_past_the_lag_bound_stops_the_steps_until_it_is_done(make_batcher):
    """The newcomer's encoder call is held; while it is younger than the bound the running row
    steps on. Once the (injected) clock passes the bound the engine thread waits for it: the
    permits for 5 more steps go unused, and the newcomer joins before the next step."""
    engine = OverlapEngine()
    clock = FakeClock()
    batcher = make_batcher(engine, clock=clock, encoder_max_lag_s=0.025)
    lag_waits = "mt_encoder_lag_waits_total"
    registry = batcher.metrics.registry
    engine.release_encoder.clear()
    running, newcomer = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(40, first=1), sentence(5, first=100)
    )
    engine.allow(1)  # step 1; then the newcomer goes to the encoder thread, and step 2 waits
    await wait_until(lambda: engine.encoded_on == ["engine-loop", "encoder_0"], "newcomer encoding")
    engine.allow(1)
    await wait_until(lambda: engine.steps == 2 and engine.waiting.is_set(), "stepped on")
    assert registry.get_sample_value(lag_waits) == 0  # within the bound: no wait
    clock.now += 0.030  # the encoder call is now 30 ms old
    engine.allow(5)
    await wait_until(lambda: registry.get_sample_value(lag_waits) == 1, "engine waits")
    assert engine.steps == 3  # step 3 was waiting for its permit already; then the wait
    engine.release_encoder.set()
    engine.allow(10**6)
    assert (await newcomer)[0].tokens == FakeEngine.expected(sentence(5, first=100).src_ids)
    assert (await running)[0].tokens == FakeEngine.expected(sentence(40, first=1).src_ids)
    assert engine.admissions[1] == (3, [1])  # joined right after the step it waited at


# --- the share of a core the encoder thread gets ----------------------------------------------


class TickingClock:
    """A clock that moves by ``tick`` at every reading: ``timed`` reads each clock twice, so
    one encoding measures exactly ``tick`` seconds."""

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_encoder_share_is_judged_over_whole_windows_and_counted_by_tenths():
    share = EncoderCpuShare(window=3)
    assert share.record(0.3, 1.0) is None
    assert share.record(0.3, 1.0) is None  # the window is not complete yet
    assert share.record(0.3, 1.0) == pytest.approx(0.3)  # 0.9 of 3 wall seconds
    assert share.record(1.0, 1.0) is None  # a fresh window
    assert share.record(0.9, 1.0) is None
    assert share.record(0.8, 1.0) == pytest.approx(0.9)
    assert share.windows_by_tenth[3] == 1 and share.windows_by_tenth[9] == 1
    assert "2 windows of 3" in share.summary() and "[0.3:1 0.9:1]" in share.summary()


def test_encoder_share_weighs_encodings_by_their_wall_time():
    """A short encoding that was descheduled does not outweigh a long one that ran."""
    share = EncoderCpuShare(window=2)
    assert share.record(0.001, 0.01) is None  # 0.1 of a core for 10 ms
    assert share.record(0.09, 0.1) == pytest.approx(0.091 / 0.11)  # 0.9 for 100 ms


def test_encoder_share_times_the_work_on_its_clocks_and_refuses_an_empty_window():
    share = EncoderCpuShare(cpu_clock=TickingClock(0.25), wall_clock=TickingClock(1.0))
    assert share.timed(lambda: "encoded") == ("encoded", 0.25, 1.0)
    with pytest.raises(ValueError, match="window"):
        EncoderCpuShare(window=0)


async def step_until(engine: GatedEngine, predicate, what: str) -> None:
    """Let the engine take one step at a time until ``predicate()`` holds (an encoding on the
    encoder thread joins at the first step boundary after it is done, however many steps)."""
    for _ in range(5000):
        if predicate():
            return
        if engine.waiting.is_set():
            engine.allow(1)
        await asyncio.sleep(0.002)
    raise AssertionError(f"never happened: {what}")


@pytest.mark.anyio
async def test_the_encoder_threads_share_of_a_core_is_exported_per_window(make_batcher):
    """Each overlapped encoding gets 0.25 of a core (injected clocks), windows of one: the
    gauge says so once the newcomer has joined; an admission into an empty batch (encoded on
    the engine thread) is not measured."""
    engine = OverlapEngine()
    encoder_share = EncoderCpuShare(
        window=1, cpu_clock=TickingClock(0.25), wall_clock=TickingClock(1.0)
    )
    batcher = make_batcher(engine, encoder_share=encoder_share)
    registry = batcher.metrics.registry
    labels = {"model": "default"}
    running, newcomer = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(30, first=1), sentence(5, first=100)
    )
    assert registry.get_sample_value("mt_encoder_cpu_share", labels) == 0  # nothing yet

    def joined() -> bool:
        return any(1 in ids for _, ids in engine.admissions)

    await step_until(engine, joined, "newcomer encoded on the encoder thread and joined")
    assert engine.encoded_on == ["engine-loop", "encoder_0"]
    assert registry.get_sample_value("mt_encoder_cpu_share", labels) == 0.25
    assert encoder_share.windows_by_tenth[2] == 1 and sum(encoder_share.windows_by_tenth) == 1
    engine.allow(10**6)
    assert (await newcomer)[0].tokens == FakeEngine.expected(sentence(5, first=100).src_ids)
    assert (await running)[0].tokens == FakeEngine.expected(sentence(30, first=1).src_ids)


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


async def _documents_beside_a_running_request(make_batcher, **limits):
    """One interactive sentence running, three one-row document requests queued, then an
    interactive newcomer queued last; every result checked. Returns the engine."""
    engine = GatedEngine()
    batcher = make_batcher(engine, background_max_rows=2, **limits)
    running = asyncio.ensure_future(batcher.submit([sentence(30)]))
    await wait_until(engine.waiting.is_set, "first step waiting")
    documents = [
        asyncio.ensure_future(batcher.submit([sentence(20, first=100 + 30 * i)], background=True))
        for i in range(3)
    ]
    await wait_until(lambda: batcher.queue_depth == 3, "three document sentences queued")
    interactive = asyncio.ensure_future(batcher.submit([sentence(4, first=400)]))
    await wait_until(lambda: batcher.queue_depth == 4, "an interactive sentence queued last")
    engine.allow(10**4)
    results = await asyncio.gather(running, interactive, *documents)
    expected = [sentence(30), sentence(4, first=400)] + [
        sentence(20, first=100 + 30 * i) for i in range(3)
    ]
    assert [r[0].tokens for r in results] == [FakeEngine.expected(s.src_ids) for s in expected]
    return engine


@pytest.mark.anyio
async def test_document_rows_wait_for_a_boundary_without_interactive_rows(make_batcher):
    """The interactive newcomer joins first though it came last; the document rows join only
    once no interactive row runs, two rows at a time."""
    engine = await _documents_beside_a_running_request(make_batcher, background_max_wait_ms=60_000)
    running_alone = 29  # the running sentence's 29 tokens
    assert engine.rows_per_step[:2] == [1, 2]
    assert max(engine.rows_per_step[:running_alone]) == 2  # no document row beside them
    assert engine.rows_per_step[running_alone] == 2  # then two document rows, not three
    assert max(engine.rows_per_step) == 2


@pytest.mark.anyio
async def test_document_rows_that_waited_long_enough_join_beside_interactive_ones(make_batcher):
    engine = await _documents_beside_a_running_request(make_batcher, background_max_wait_ms=0)
    # the interactive newcomer alone first, then two document rows beside both, never three
    assert engine.rows_per_step[:3] == [1, 2, 4]
    assert max(engine.rows_per_step) == 4


@pytest.mark.anyio
async def test_a_lone_document_paragraph_runs_whatever_the_background_row_limit(make_batcher):
    engine = FakeEngine()
    batcher = make_batcher(engine, background_max_rows=1)
    rows = [sentence(5, first=10 * i + 1) for i in range(3)]  # one unit of three rows
    results = await batcher.submit(rows, background=True)
    assert [r.tokens for r in results] == [FakeEngine.expected(row.src_ids) for row in rows]
    assert engine.rows_per_step[0] == 3  # the whole paragraph joined an empty batch
