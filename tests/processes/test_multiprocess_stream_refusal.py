"""A front-end of the multi-process service refuses a streamed request the way the one-process
service does when the engine core's queue is full: a plain 429 with Retry-After before the
stream starts, not a started stream whose first event is the error.

The front-end's view of the queue comes from the engine core's pongs (a tenth of a second old,
and blind to the other front-ends' rows), so the engine core may refuse rows the front-end sent;
that refusal must still come back as the response's status. A stand-in engine core (a ZeroMQ
ROUTER in a thread of this process) answers pings as an idle core does and refuses every
submission with ``queue_full``; the front-end is the real app."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import zmq

from service.config import Settings
from service.engine_core.plan import ProcessPlan
from service.engine_core.protocol import (
    CoreLoad,
    EngineCoreInfo,
    Failed,
    Ping,
    Pong,
    Submit,
    ToCore,
    encode,
)
from service.translation.discovery import discover_models
from service.wiring import create_app
from tests.engine_core.stand_in import StandInCore
from tests.ready import wait_ready_async
from tests.service_fixtures import only_model, tiny_model

QUEUE_FULL = "the queue is full (4 of MT_MAX_QUEUE=4 sentences waiting; this request has 1)"


class RefusingCore(StandInCore):
    """An engine core that is up, idle by its pongs, and refuses every submission."""

    def __init__(self, address: str, model_id: str) -> None:
        super().__init__(address)
        # Cleared: the front-end's start-up probe is answered, its client's pings are not yet
        # (the client starts before its first pong, a window of a ping's round trip).
        self.speaking = threading.Event()
        self.speaking.set()
        self._probe: bytes | None = None
        self.info = EngineCoreInfo(model_id, "cpu", None, max_queue=4)
        self.submissions = 0

    def answer(self, router: zmq.Socket, peer: bytes, message: ToCore) -> None:
        if isinstance(message, Ping):
            self._probe = self._probe or peer
            if not self.speaking.is_set() and peer != self._probe:
                return
            load = CoreLoad(os.getpid(), accepting=True, queue_depth=0, active_rows=0)
            router.send_multipart([peer, encode(Pong(message.sent_at, self.info, load))])
        elif isinstance(message, Submit):
            self.submissions += 1
            refusal = Failed(message.request_id, "queue_full", QUEUE_FULL)
            router.send_multipart([peer, encode(refusal)])


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mt-refuse-"))  # short: ipc paths are bounded
    yield path
    shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def frontend(
    model_dir: Path, data_dir: Path, address: str, model_id: str, heard: bool = True
):
    settings = Settings(
        exports=[model_dir],
        provider="cpu",
        data_dir=data_dir,
        language_detection=False,
        retry_after_s=3,
    )
    plan = ProcessPlan(1, 1, 1, 2, {model_id: [address]})
    app = create_app(settings, engine_cores=plan)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mt") as client:
            await wait_ready_async(  # ready, and (``heard``) the first pong heard
                client,
                until=lambda ready: (
                    ready.status_code == 200
                    and (only_model(app).batcher.live_replicas > 0 or not heard)
                ),
            )
            yield client


@pytest.mark.anyio
async def test_a_stream_the_engine_core_refuses_gets_a_plain_429(
    tmp_path_factory, tmp_path, run_dir
):
    model_dir = tiny_model(tmp_path_factory)
    [spec] = discover_models([model_dir], None)
    address = f"ipc://{run_dir / 'core.sock'}"
    with RefusingCore(address, spec.model_id) as core:
        async with frontend(model_dir, tmp_path / "data", address, spec.model_id) as client:
            streamed = await client.post("/v1/translate/stream", json={"text": "Save changes"})
            whole = await client.post("/v1/translate", json={"text": "Save changes"})
        assert core.submissions == 2
    for response in (streamed, whole):
        assert response.status_code == 429, response.text
        assert response.headers["retry-after"] == "3"
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["code"] == "queue_full"
        assert "MT_MAX_QUEUE=4" in response.json()["error"]


@pytest.mark.anyio
async def test_a_stream_sent_before_the_first_pong_waits_for_the_engine_core(
    tmp_path_factory, tmp_path, run_dir
):
    """Right after start-up, rows reach the engine core once it answers (within a second),
    streamed or not, instead of finding no replica live (503)."""
    model_dir = tiny_model(tmp_path_factory)
    [spec] = discover_models([model_dir], None)
    address = f"ipc://{run_dir / 'core.sock'}"
    with RefusingCore(address, spec.model_id) as core:
        core.speaking.clear()
        data_dir = tmp_path / "data"
        async with frontend(model_dir, data_dir, address, spec.model_id, heard=False) as client:
            asyncio.get_running_loop().call_later(0.3, core.speaking.set)
            streamed = await client.post("/v1/translate/stream", json={"text": "Save changes"})
        assert core.submissions == 1
    assert streamed.status_code == 429, streamed.text  # the core's answer, not 503


@pytest.mark.anyio
async def test_an_idle_engine_core_is_sent_a_request_longer_than_its_queue(
    tmp_path_factory, tmp_path, run_dir
):
    """As the one-process batcher: an empty queue takes any request within the text limits,
    so the front-end sends it rather than refusing it from its own view of the queue."""
    model_dir = tiny_model(tmp_path_factory)
    [spec] = discover_models([model_dir], None)
    address = f"ipc://{run_dir / 'core.sock'}"
    # six sentences, a queue of four
    text = "Save changes. Open the file. Close it. Edit the name. Print it. Delete all files."
    with RefusingCore(address, spec.model_id) as core:
        async with frontend(model_dir, tmp_path / "data", address, spec.model_id) as client:
            response = await client.post("/v1/translate", json={"text": text})
        assert core.submissions == 1  # the engine core decides, as an idle batcher would
    assert response.json()["error"] == QUEUE_FULL  # the stand-in's answer, not the front-end's
