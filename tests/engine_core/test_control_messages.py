"""The control messages between the supervisor, an engine-core process and a front-end's
client (service/engine_core/control.py, retirement.py): readiness is the core's first pong to
the supervisor; after ``Retire`` the core's pongs move the client to the successors, rows in
flight are answered where they are, and the core says ``Free`` once the client detached, or once
a front-end that never detaches (killed) has been silent a while."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from service.engine_core.client import EngineCoreClient
from service.engine_core.control import CoreControl, ping_socket, probe
from service.engine_core.protocol import Ping, decode_from_core, encode
from service.engine_core.retirement import FRONTEND_PREFIX, PEER_SILENCE_S
from service.runtime.types import DecodeRequest
from service.text.tokenizer import Tokenizer
from tests.engine_core.test_engine_core_client import TEXTS, start_engine_core, wait_for
from tests.service_fixtures import tiny_model

SUCCESSOR = "ipc:///nowhere/engine-0-0-g1.sock"  # only named: the client does not connect


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture
def old_core(model_dir) -> Iterator[tuple[str, CoreControl]]:
    """An engine-core process of the tiny model, and the supervisor's control of it."""
    run_dir = Path(tempfile.mkdtemp(prefix="mt-ctl-"))  # short: ipc paths are bounded
    address = f"ipc://{run_dir}/core.sock"
    process = start_engine_core(model_dir, address)
    control = CoreControl([address])
    try:
        yield address, control
    finally:
        control.close()
        process.kill()
        process.wait()
        shutil.rmtree(run_dir, ignore_errors=True)


def polled(control: CoreControl) -> CoreControl:
    control.poll()
    return control


@pytest.mark.anyio
async def test_a_retired_core_moves_its_client_and_is_free_once_the_client_detached(
    model_dir, old_core
):
    address, control = old_core
    await wait_for(lambda: polled(control).ready, "the core answers the supervisor", 120)
    pong = await asyncio.to_thread(probe, [address], 60.0)
    assert pong.moved_to is None
    moves: list[tuple[list[str], int]] = []
    client = EngineCoreClient(
        [address], pong.info, on_moved=lambda at, version: moves.append((at, version))
    )
    client.start()
    tokenizer = Tokenizer.from_dir(model_dir)
    rows = [
        DecodeRequest(src_ids=tuple(tokenizer.encode_one(text)), max_new_tokens=32)
        for text in TEXTS
    ]
    try:
        await wait_for(lambda: client.live_replicas == 1, "the core is live")
        in_flight = asyncio.create_task(client.submit(rows))
        control.retire([SUCCESSOR], 1)
        retired_at = time.monotonic()
        await wait_for(lambda: moves, "the client hears the move")
        assert moves[0] == ([SUCCESSOR], 1)
        assert time.monotonic() - retired_at < 2.0  # within a few pings, not a poll of 10 s
        results = await in_flight  # answered by the retired core: none lost
        assert len(results) == len(rows) and all(result.tokens for result in results)
        # attached (pinging) past the silence: the core waits for it
        await wait_for(lambda: time.monotonic() - retired_at > PEER_SILENCE_S + 0.5, "silence")
        assert not polled(control).freed
    finally:
        await client.shutdown(1.0)  # the last row answered: detaches
    detached_at = time.monotonic()
    await wait_for(lambda: polled(control).freed == {address}, "the core says Free", 10)
    assert time.monotonic() - detached_at < 2.0  # at the Detach, not after a wait


@pytest.mark.anyio
async def test_a_frontend_that_never_detaches_holds_a_retired_core_only_for_the_silence(
    old_core,
):
    address, control = old_core
    await wait_for(lambda: polled(control).ready, "the core answers the supervisor", 120)
    context = zmq.Context()
    frontend = ping_socket(context, address, FRONTEND_PREFIX + b"999-killed")
    with contextlib.closing(frontend):
        frontend.send(encode(Ping(time.monotonic())))
        assert frontend.poll(10_000)
        decode_from_core(frontend.recv())
        control.retire([SUCCESSOR], 1)
        # The order and the pings travel on two connections, in no order between them: ping
        # until a pong says the core moved (it has heard the order), then fall silent (killed).
        deadline = time.monotonic() + 10.0
        moved_to = None
        while moved_to is None and time.monotonic() < deadline:
            last_heard = time.monotonic()
            frontend.send(encode(Ping(last_heard)))
            assert frontend.poll(10_000)
            moved_to = decode_from_core(frontend.recv()).moved_to  # type: ignore[union-attr]
        assert moved_to == [SUCCESSOR]
    context.term()
    await wait_for(lambda: polled(control).freed == {address}, "the core says Free", 15)
    assert time.monotonic() - last_heard >= PEER_SILENCE_S  # not while it might be alive
