"""Faults and overload against the real app and the tiny real model, with the engine wrapped
so a test can hold decoder steps (the gate of tests/system/test_concurrency.py) and inject a fault
into one of them. Assertions are about what each request got, never about wall time.

Each test runs in both process modes (``process_mode``, tests/servers.py ``serving_engine``):
the engine in the app's process, or behind the real engine-core server and a front-end's app.

* an engine error in one step fails the requests in that step only (a clear 500), and
  requests still queued at the time go on;
* a dead engine thread fails what it held at once. In one process it refuses new work with
  503 and turns ``/health`` and ``/ready`` to 503, so an orchestrator restarts the process. In
  an engine core, the core stops (its process ends, and the supervisor starts a new one): the
  front-end stays healthy and answers 503 with Retry-After until a core is up again;
* beyond ``MT_MAX_INFLIGHT_REQUESTS`` a translation request is refused with 429 from its
  headers, before its body is read.
"""

from __future__ import annotations

import asyncio

import pytest

from service.runtime.engine import Engine
from service.runtime.types import FinishedRequest
from tests.servers import serving_engine
from tests.service_fixtures import tiny_model
from tests.system.test_concurrency import GatedEngine, settings_for, wait_until


class EngineThreadKilled(BaseException):
    """Escapes the batcher's ``except Exception``, as a bug in its own loop would."""


class FaultyEngine(GatedEngine):
    """The gated real engine; ``fault`` is raised by the next step once it gets a permit."""

    fault: BaseException | None = None

    def step(self) -> list[FinishedRequest]:
        with self._gate:
            while self._closed and self._permits == 0:
                self.waiting.set()
                self._gate.wait()
            self.waiting.clear()
            if self._closed:
                self._permits -= 1
            fault, self.fault = self.fault, None
        if fault is not None:
            raise fault
        return self._engine.step()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine(model_dir):
    faulty = FaultyEngine(Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1))
    yield faulty
    faulty.open()


def translate(client, text: str):
    return asyncio.ensure_future(
        client.post("/v1/translate", json={"text": text, "max_new_tokens": 6})
    )


@pytest.mark.anyio
async def test_an_engine_error_fails_only_the_requests_in_that_step(
    model_dir, engine, process_mode
):
    async with serving_engine(process_mode, settings_for(model_dir), engine) as served:
        client, batcher = served.client, served.batcher
        engine.close()
        in_step = translate(client, "Save changes")
        await wait_until(engine.waiting.is_set, "the first request's step waits at the gate")
        queued = translate(client, "Open the file")
        await wait_until(lambda: batcher.queue_depth == 1, "the second request is queued")
        engine.fault = RuntimeError("injected: CUDA error at /srv/models/secret/decoder.onnx")
        engine.open()
        failed, served_ = await in_step, await queued
        assert failed.status_code == 500
        assert failed.json() == {
            "error": "the engine failed during decoding (RuntimeError)",
            "code": "engine_failure",
        }
        assert "/srv" not in failed.text  # the fault's text stays in the log
        assert served_.status_code == 200 and served_.json()["translations"][0]["text"]
        after = await client.post("/v1/translate", json={"text": "Close", "max_new_tokens": 6})
        assert after.status_code == 200
        assert (await client.get("/health")).status_code == 200


@pytest.mark.anyio
async def test_a_dead_engine_thread_fails_its_work_and_the_process_that_held_it_stops_serving(
    model_dir, engine, process_mode
):
    async with serving_engine(process_mode, settings_for(model_dir), engine) as served:
        client, batcher = served.client, served.batcher
        engine.close()
        in_step = translate(client, "Save changes")
        await wait_until(engine.waiting.is_set, "the request's step waits at the gate")
        queued = translate(client, "Open the file")
        await wait_until(lambda: batcher.queue_depth == 1, "the second request is queued")
        engine.fault = EngineThreadKilled()
        engine.open()
        # Neither request hangs until its timeout: both fail at once.
        for response in (await in_step, await queued):
            assert response.status_code == 500
            assert response.json()["code"] == "engine_failure"
            assert "engine thread stopped" in response.json()["error"]
        if process_mode == "single":
            # the one process must be restarted: its health checks say so
            health, ready = await client.get("/health"), await client.get("/ready")
            assert health.status_code == 503 and health.json()["status"] == "failed"
            assert "engine thread" in health.json()["detail"]
            assert ready.status_code == 503
        else:
            # the engine core ends (the supervisor restarts its process); the front-end lives
            core = served.core
            assert core is not None
            await wait_until(lambda: not core.serving, "the engine core stopped")
            assert core.drained is False  # its process exits 1
            assert (await client.get("/health")).status_code == 200
        refused = await client.post("/v1/translate", json={"text": "Close"})
        assert refused.status_code == 503 and "Retry-After" in refused.headers


@pytest.mark.anyio
async def test_beyond_max_inflight_requests_the_answer_is_429_before_the_body_is_read(
    model_dir, engine, process_mode
):
    settings = settings_for(model_dir, max_inflight_requests=2)
    async with serving_engine(process_mode, settings, engine) as served:
        client, app = served.client, served.app
        engine.close()
        first = translate(client, "Save changes")
        await wait_until(engine.waiting.is_set, "the first request decodes")
        second = translate(client, "Open the file")
        await wait_until(
            lambda: app.state.service.metrics.inflight_requests._value.get() == 2,
            "two requests in flight",
        )
        # Not even JSON: refused on its headers alone, so the answer is 429, not 400.
        refused = await client.post(
            "/v1/translate", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert refused.status_code == 429
        assert refused.json()["code"] == "overloaded"
        assert refused.headers["Retry-After"] == "1" and refused.headers["X-Request-ID"]
        libre = await client.post("/translate", json={"q": "Save"})
        assert libre.status_code == 429
        # Health, metrics and the rest are never gated.
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        engine.open()
        assert (await first).status_code == 200 and (await second).status_code == 200
        after = await client.post("/v1/translate", json={"text": "Close", "max_new_tokens": 6})
        assert after.status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'mt_rejections_total{reason="overloaded"} 2.0' in metrics
