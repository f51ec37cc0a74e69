"""A front-end's links to its engine cores (service/engine_core/links.py) when the front-end's
own event loop is held: the real engine-core server in a thread (tests/servers.py), a client
of it on this event loop, the engine behind a gate (tests/system/test_concurrency.py)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from service.config import Settings
from service.engine_core.client import EngineCoreClient
from service.runtime.engine import Engine
from service.runtime.types import DecodeRequest
from service.text.tokenizer import Tokenizer
from tests.servers import EngineCoreThread
from tests.service_fixtures import tiny_model
from tests.system.test_concurrency import GatedEngine

PING_S, SILENCE_S = 0.5, 1.5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.001)


@pytest.mark.anyio
async def test_a_front_end_whose_event_loop_was_held_does_not_take_its_engine_core_for_hung(
    model_dir,
):
    settings = Settings(exports=[model_dir], provider="cpu", intra_op_threads=1)
    engine = GatedEngine(Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1))
    core = EngineCoreThread(settings, engine)
    core.start()
    client = EngineCoreClient([core.address], core.server.info, ping_s=PING_S, silence_s=SILENCE_S)
    try:
        client.start()
        [replica] = client.replicas
        await wait_for(lambda: client.live_replicas == 1, "the engine core live")
        engine.close()
        src = tuple(Tokenizer.from_dir(model_dir).encode_one("Save changes"))
        row = DecodeRequest(src_ids=src, max_new_tokens=4)
        in_flight = asyncio.ensure_future(client.submit([row]))
        await wait_for(engine.waiting.is_set, "the row decodes")
        heard = replica.heard_at
        await wait_for(lambda: replica.heard_at != heard, "a pong read")
        # Just after a pong (the next ping is a good part of PING_S away) the front-end's own
        # work holds its loop past the silence bound: no ping goes out and no pong comes in,
        # yet the core was never silent.
        time.sleep(SILENCE_S + 1.0)
        await asyncio.sleep(PING_S * 1.5)  # the heartbeat judges; the reader takes the pong
        engine.open()
        [result] = await in_flight  # not failed as lost with its engine core
        assert result.tokens and client.live_replicas == 1
    finally:
        engine.open()
        client.close()
        core.stop()


@pytest.mark.anyio
async def test_an_undecodable_message_is_skipped_and_the_next_one_read(caplog):
    # A peer of another version must not stop a reader: the message after it still arrives.
    from service.engine_core.links import _messages

    class Socket:
        def __init__(self, payloads: list[bytes]) -> None:
            self.payloads = payloads

        async def recv(self) -> bytes:
            return self.payloads.pop(0)

    def decode(payload: bytes) -> str:
        if payload == b"garbled":
            raise msgspec.DecodeError("not a message")
        return payload.decode()

    messages = _messages(Socket([b"garbled", b"pong"]), decode, "an engine core")  # type: ignore[arg-type]
    assert await anext(messages) == "pong"
    assert "undecodable message from an engine core" in caplog.text
