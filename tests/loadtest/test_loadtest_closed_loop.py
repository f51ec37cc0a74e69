"""The closed loop: at most its concurrency outstanding, against a mock service, the spawned
stub server, and the raw HTTP client."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest

from loadtest.client import (
    RequestRecord,
    spawned_server,
)
from loadtest.closed_loop import run_closed_loop
from loadtest.inputs import InputSampler
from tests.loadtest.loadtest_helpers import URL


def test_closed_loop_keeps_at_most_concurrency_requests_outstanding():
    state = {"now": 0, "peak": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return httpx.Response(200, json={"translations": [{"text": "x", "tokens": 2}]})

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await run_closed_loop(
                client, URL, InputSampler(seed=0), concurrency=3, max_requests=12
            )

    records = asyncio.run(scenario())
    assert len(records) == 12 and all(r.ok for r in records)
    assert state["peak"] == 3
    assert [r.index for r in records] == list(range(12))
    assert all(r.output_tokens == 2 for r in records)


def test_spawned_stub_server_serves_a_short_closed_loop_and_stops(tmp_path):
    command = [sys.executable, "-m", "loadtest.stub_server", "--port", "{port}", "--base-ms", "1"]
    with spawned_server(
        None, command=command, ready_timeout_s=60, log_path=tmp_path / "stub.log"
    ) as url:
        assert url.startswith("http://127.0.0.1:")

        async def scenario() -> list[RequestRecord]:
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                return await run_closed_loop(
                    client, url, InputSampler(seed=0), concurrency=2, max_requests=6
                )

        records = asyncio.run(scenario())
    assert [r.status for r in records] == [200] * 6
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/ready", timeout=2, trust_env=False)


def test_raw_client_runs_the_same_loops_and_survives_closed_keep_alive_connections(tmp_path):
    from loadtest.client import spawned_process
    from loadtest.process_stats import ProcessSampler, cpu_split, thread_cpu_seconds
    from loadtest.raw_http import RawClient

    command = [sys.executable, "-m", "loadtest.stub_server", "--port", "{port}", "--base-ms", "1"]
    with spawned_process(None, command=command, ready_timeout_s=60) as (url, process):

        async def scenario() -> tuple[list[RequestRecord], int]:
            async with RawClient(url, max_connections=2, timeout_s=10) as client:
                records = await run_closed_loop(
                    client, url, InputSampler(seed=0), concurrency=2, max_requests=6
                )
                # A pooled connection the server has closed meanwhile is retried, not an error.
                for connection in client._free:
                    connection.writer.transport.abort()
                again = await client.post(url + "/v1/translate", json={"text": "Save"})
                return records, again.status_code

        before = thread_cpu_seconds(process.pid)
        records, status_after_close = asyncio.run(scenario())
        sampler = ProcessSampler(process.pid)
        sampler.sample(started=0.0)
        split = cpu_split(process.pid, before, thread_cpu_seconds(process.pid))
    assert [r.status for r in records] == [200] * 6
    assert all(r.output_chars > 0 for r in records)
    assert status_after_close == 200
    assert sampler.samples[0]["rss_mb"] > 0 and sampler.samples[0]["fds"] > 0
    assert split["threads"] >= 1 and split["loop_cpu_s"] >= 0
