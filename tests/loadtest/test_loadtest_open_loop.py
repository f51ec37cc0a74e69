"""The open-loop sender does not wait on responses: it sends on schedule, counts latency
from the scheduled time, caps what is in flight and records errors."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from loadtest.client import (
    RequestRecord,
    send_translate,
)
from loadtest.inputs import InputSampler
from loadtest.open_loop import run_open_loop
from loadtest.report import (
    summarize,
)
from tests.loadtest.loadtest_helpers import URL


def gated_transport(
    expected: int, release_timeout_s: float = 10.0
) -> tuple[httpx.MockTransport, dict]:
    """A mock service whose handler holds every request until ``expected`` requests have
    arrived (or the timeout passes). A sender that waited on responses would deliver one
    request at a time and every response would be released by the timeout instead."""
    state = {"arrived": 0, "released_by_gate": 0, "released_by_timeout": 0}
    gate = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        state["arrived"] += 1
        if state["arrived"] >= expected:
            gate.set()
        try:
            await asyncio.wait_for(gate.wait(), release_timeout_s)
            state["released_by_gate"] += 1
        except TimeoutError:
            state["released_by_timeout"] += 1
            gate.set()  # the verdict is in; don't make a broken sender pay the timeout per request
        return httpx.Response(
            200,
            json={
                "translations": [{"text": "ok", "tokens": 1, "sentences": 1}],
                "usage": {"output_tokens": 1},
            },
        )

    return httpx.MockTransport(handler), state


def test_open_loop_sends_on_schedule_while_responses_are_held_back():
    schedule = [
        0.02 * i for i in range(15)
    ]  # 15 arrivals over 0.28 s; nothing returns before all arrive
    transport, state = gated_transport(expected=len(schedule))

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=transport) as client:
            return await run_open_loop(
                client, URL, schedule, InputSampler(seed=0), max_in_flight=64
            )

    records = asyncio.run(scenario())
    assert state["released_by_gate"] == len(schedule) and state["released_by_timeout"] == 0
    assert [r.scheduled_s for r in records] == schedule
    assert all(r.ok for r in records)
    # Sent at (not before, and not long after) the scheduled offsets; generous for a busy box.
    lags = [r.sent_s - r.scheduled_s for r in records]
    assert min(lags) >= -0.005
    assert statistics.median(lags) < 0.5
    # Latency counts from the schedule: every request waited for the last arrival.
    assert all(r.completed_s >= schedule[-1] - 0.005 for r in records)


def test_latency_counts_from_the_scheduled_time_when_the_sender_is_late():
    async def instant(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"translations": [{"text": "x"}], "usage": {"output_tokens": 4}}
        )

    async def scenario() -> RequestRecord:
        async with httpx.AsyncClient(transport=httpx.MockTransport(instant)) as client:
            record = RequestRecord(index=0, scheduled_s=0.0)
            # The run "started" 1 s ago and this request was due then: it is sent 1 s late.
            run_start = time.perf_counter() - 1.0
            return await send_translate(client, URL, {"text": "Save changes"}, record, run_start)

    record = asyncio.run(scenario())
    assert record.ok and record.output_tokens == 4 and record.input_chars == len("Save changes")
    assert record.sent_s >= 1.0 and record.latency_s >= record.sent_s


def test_open_loop_drops_arrivals_beyond_the_in_flight_cap():
    schedule = [0.0] * 6  # all due at once: the sender never yields before creating them

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return httpx.Response(200, json={"translations": [{"text": "x"}]})

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as client:
            return await run_open_loop(client, URL, schedule, InputSampler(seed=0), max_in_flight=3)

    records = asyncio.run(scenario())
    assert [r.dropped for r in records] == [False] * 3 + [True] * 3
    assert all(r.ok for r in records[:3])
    assert summarize(records, duration_s=1.0)["by_status"] == {"200": 3, "dropped": 3}


def test_the_generators_default_cap_is_above_the_services_in_flight_limit():
    """Under overload the service's admission control, not the generator's cap, must decide
    who is refused (loadtest/open_loop.py's docstring)."""
    from loadtest.open_loop import DEFAULT_MAX_IN_FLIGHT
    from service.config import AccessSettings

    assert AccessSettings.model_fields["max_inflight_requests"].default < DEFAULT_MAX_IN_FLIGHT


def test_open_loop_records_errors_without_raising():
    async def failing(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/translate":
            return httpx.Response(404)
        if b"Save" in request.content:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(429, headers={"Retry-After": "2"}, json={"error": "queue full"})

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(failing)) as client:
            return await run_open_loop(client, URL, [0.0] * 20, InputSampler(seed=0))

    records = asyncio.run(scenario())
    statuses = {r.status for r in records}
    assert statuses <= {0, 429} and 429 in statuses
    assert all(r.retry_after_s == 2.0 for r in records if r.status == 429)
    assert all(r.error for r in records)
