"""The scheduler's plan for one step boundary (service/scheduling/scheduler.py): every
decision the engine loop carries out, made by ``Scheduler.schedule`` alone."""

from __future__ import annotations

import threading
import time

import pytest

from service.metrics import ServiceMetrics
from service.scheduling.chooser import Choice, Refusal
from service.scheduling.overlap import EncoderOverlap
from service.scheduling.scheduler import EncoderCall, Scheduler
from service.scheduling.sentences import SentenceQueue
from service.scheduling.settings import BatchingSettings
from service.scheduling.timeline import PhaseClock
from tests.scheduling.batcher_helpers import FakeEngine, sentence


@pytest.fixture
def anyio_backend():
    return "asyncio"


def a_scheduler(encoder_thread: bool, clock=time.monotonic, **settings) -> Scheduler:
    engine, metrics = FakeEngine(), ServiceMetrics().for_model("m")
    settings = {"batching": "continuous", "admission_idle_wait_ms": 0.0, **settings}
    config = BatchingSettings.model_validate(settings)
    overlap = EncoderOverlap(engine.encode, metrics, time.monotonic) if encoder_thread else None
    return Scheduler(
        engine,
        SentenceQueue(64, clock),
        config,
        overlap,
        metrics,
        phases=PhaseClock(metrics.engine_phase),
        idle=threading.Event(),
        clock=clock,
    )


@pytest.mark.anyio
@pytest.mark.parametrize("encoder_thread", [False, True])
async def test_the_plan_says_where_the_newcomers_encoder_call_runs(encoder_thread):
    """Into an empty batch newcomers are encoded in line (nothing runs to overlap with);
    beside running rows, on the encoder thread where there is one."""
    scheduler = a_scheduler(encoder_thread)
    [first] = scheduler.queue.put([sentence(4)])
    output = scheduler.schedule()
    assert output is not None
    assert (output.newcomers, output.dropped) == ([first], [])
    assert output.encoder is EncoderCall.IN_LINE
    assert output.busy and output.await_encoder and not output.encoded_joins
    assert len(scheduler.queue) == 0  # taken from the queue

    scheduler.joined(first)  # the loop placed it: it runs
    [second] = scheduler.queue.put([sentence(3, first=50)])
    output = scheduler.schedule()
    assert output is not None and output.newcomers == [second]
    expected = EncoderCall.OVERLAPPED if encoder_thread else EncoderCall.IN_LINE
    assert output.encoder is expected
    assert output.busy and not output.await_encoder


@pytest.mark.anyio
async def test_the_plan_drops_the_abandoned_running_sentences_and_stops_when_told():
    scheduler = a_scheduler(False)
    [first, second] = scheduler.queue.put([sentence(4), sentence(5, first=9)])
    output = scheduler.schedule()
    assert output is not None and output.newcomers == [first, second]
    for admitted in output.newcomers:
        scheduler.joined(admitted)
    with scheduler.queue.cond:
        scheduler.queue.withdraw({first.sentence_id})  # its client is gone
    output = scheduler.schedule()
    assert output is not None
    assert (output.dropped, output.newcomers, output.busy) == ([first.sentence_id], [], True)
    scheduler.remove(output.dropped)
    assert list(scheduler.running) == [second.sentence_id]

    scheduler.queue.stopping = True
    assert scheduler.schedule() is None


@pytest.mark.anyio
async def test_a_static_batch_takes_no_one_while_it_runs():
    """The policy is the scheduler's: a static batch is closed until its rows have finished."""
    scheduler = a_scheduler(False, batching="static", static_max_wait_ms=0.0)
    [first] = scheduler.queue.put([sentence(4)])
    output = scheduler.schedule()
    assert output is not None and output.newcomers == [first]
    scheduler.joined(first)
    scheduler.queue.put([sentence(3, first=50)])
    output = scheduler.schedule()
    assert output is not None and (output.newcomers, output.busy) == ([], True)
    assert len(scheduler.queue) == 1


@pytest.mark.anyio
async def test_the_plan_carries_the_whole_choice_who_joins_or_why_nobody_does():
    """The chooser's answer travels in the plan: the newcomers it took, or why it took none;
    where the last deferral holds, no choice is made at all."""
    scheduler = a_scheduler(False, clock=lambda: 1000.0)  # the clock stands still
    [first] = scheduler.queue.put([sentence(4)])
    output = scheduler.schedule()
    assert output is not None and output.choice == Choice.take([first])
    scheduler.joined(first)
    # a document's sentence waits beside interactive rows (background_max_wait_ms)
    scheduler.queue.put([sentence(3, first=50)], background=True)
    output = scheduler.schedule()
    assert output is not None and output.newcomers == []
    assert output.choice == Choice.defer(Refusal.BACKGROUND)
    output = scheduler.schedule()  # nothing changed: the deferral holds
    assert output is not None and output.choice is None
