"""Encoder overlap: newcomers encoded on the encoder thread while rows run, its failures,
its idle priority, the lag bound, and the share of a core it gets."""

from __future__ import annotations

import asyncio
import os

import pytest

from service.errors import EngineFailure
from service.runtime.types import DecodeRequest
from service.scheduling import overlap
from service.scheduling.overlap import ENCODER_MAX_LAG_S, EncoderCpuShare
from tests.scheduling.batcher_helpers import (
    FakeClock,
    FakeEncoded,
    FakeEngine,
    OverlapEngine,
    a_running_row_and_a_newcomer,
    sentence,
    step_until,
    wait_until,
)


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
    running, newcomer = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(30, first=1), sentence(20, first=40)
    )
    # the newcomer's encoder call waits (the running row's, in line, is done by now)
    engine.release_encoder.clear()
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
async def test_the_encoder_thread_runs_at_idle_priority_unless_told_not_to(
    make_batcher, monkeypatch, idle
):
    monkeypatch.setattr(overlap, "ENCODER_IDLE_PRIORITY", idle)
    engine = PolicyRecordingEngine()
    batcher = make_batcher(engine)
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
    batcher = make_batcher(engine, clock=clock)
    lag_waits = "mt_encoder_lag_waits_total"
    registry = batcher.metrics.registry
    running, newcomer = await a_running_row_and_a_newcomer(
        batcher, engine, sentence(40, first=1), sentence(5, first=100)
    )
    engine.release_encoder.clear()  # the newcomer's encoder call waits
    engine.allow(1)  # step 1; then the newcomer goes to the encoder thread, and step 2 waits
    await wait_until(lambda: engine.encoded_on == ["engine-loop", "encoder_0"], "newcomer encoding")
    engine.allow(1)
    await wait_until(lambda: engine.steps == 2 and engine.waiting.is_set(), "stepped on")
    assert registry.get_sample_value(lag_waits) == 0  # within the bound: no wait
    clock.now += ENCODER_MAX_LAG_S + 0.005  # the encoder call is now past the bound
    engine.allow(5)
    await wait_until(lambda: registry.get_sample_value(lag_waits) == 1, "engine waits")
    assert engine.steps == 3  # step 3 was waiting for its permit already; then the wait
    engine.release_encoder.set()
    engine.allow(10**6)
    assert (await newcomer)[0].tokens == FakeEngine.expected(sentence(5, first=100).src_ids)
    assert (await running)[0].tokens == FakeEngine.expected(sentence(40, first=1).src_ids)
    assert engine.admissions[1] == (3, [1])  # joined right after the step it waited at


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


@pytest.mark.anyio
async def test_the_encoder_threads_share_of_a_core_is_exported_per_window(make_batcher):
    """Each overlapped encoding gets 0.25 of a core (injected clocks), windows of one: the
    gauge says so once the newcomer has joined; an admission into an empty batch (encoded on
    the engine thread) is not measured."""
    engine = OverlapEngine()
    encoder_share = EncoderCpuShare(
        window=1, cpu_clock=TickingClock(0.25), wall_clock=TickingClock(1.0)
    )
    batcher = make_batcher(engine)
    batcher._loop.overlap.share = encoder_share  # measured on the test's clocks
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
