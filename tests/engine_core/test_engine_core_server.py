"""The engine core's answers (service/engine_core/server.py), in this process over a fake
engine that steps only when the test allows: one ``RowsDone`` per engine step for each
front-end, whatever the number of rows the step finished."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from service.engine_core.protocol import (
    Abort,
    Accepted,
    EngineCoreInfo,
    Failed,
    FromCore,
    RowsDone,
    decode_from_core,
    encode,
    submit,
)
from service.engine_core.server import EngineCoreServer, tuned
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.settings import BatchingSettings
from tests.scheduling.batcher_helpers import FakeEngine, GatedEngine, sentence, wait_until

INFO = EngineCoreInfo("tiny", "cpu", None, 256)


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Core:
    """A served engine core over a ``GatedEngine`` and the front-ends' sockets to it."""

    def __init__(self, engine: GatedEngine, batcher: ContinuousBatcher, address: str) -> None:
        self.engine = engine
        self.batcher = batcher
        self.address = address
        self.context = zmq.asyncio.Context()
        self.sockets: list[zmq.asyncio.Socket] = []

    def front_end(self) -> zmq.asyncio.Socket:
        socket = self.context.socket(zmq.DEALER)
        tuned(socket)
        socket.connect(self.address)
        self.sockets.append(socket)
        return socket


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[Core]:
    engine = GatedEngine()
    config = BatchingSettings(encoder_overlap=False, admission_idle_wait_ms=0.0)
    batcher = ContinuousBatcher(engine, config, spare_core=False)
    with tempfile.TemporaryDirectory(prefix="mt-core-") as run_dir:  # short: ipc paths
        address = f"ipc://{Path(run_dir) / 'core.sock'}"
        server = EngineCoreServer(batcher, INFO, address)
        serving = asyncio.create_task(server.serve(grace_s=1.0))
        core = Core(engine, batcher, address)
        try:
            yield core
        finally:
            engine.allow(10**6)
            server.stop()
            await serving
            for socket in core.sockets:
                socket.close(linger=0)
            core.context.term()


async def answers(socket: zmq.asyncio.Socket, rows: int) -> list[FromCore]:
    """Messages from the engine core until ``rows`` rows were answered or failed."""
    messages: list[FromCore] = []
    answered = 0
    async with asyncio.timeout(10):
        while answered < rows:
            message = decode_from_core(await socket.recv())
            messages.append(message)
            if isinstance(message, RowsDone):
                answered += len(message.rows)
            elif isinstance(message, Failed):
                answered = rows
    return messages


@pytest.mark.anyio
async def test_each_front_end_gets_one_message_per_step_with_every_row_it_finished():
    async with served() as core:
        first, second = core.front_end(), core.front_end()
        three = [sentence(4, first=5 + i) for i in range(3)]  # 3 tokens each: the same step
        two = [sentence(4, first=20 + i) for i in range(2)]
        await first.send(encode(submit(0, three, False, 60.0, acknowledge=True)))
        await wait_until(core.engine.waiting.is_set, "the first request's rows stepping")
        await second.send(encode(submit(0, two, False, 60.0)))
        await second.send(encode(submit(1, two, False, 60.0)))
        await wait_until(lambda: core.batcher.queue_depth == 4, "the second front-end's rows")
        core.engine.allow(10)

        to_first, to_second = await answers(first, 3), await answers(second, 4)
        accepted, done = to_first
        assert accepted == Accepted(0)
        assert isinstance(done, RowsDone)
        assert [(row.request_id, row.index) for row in done.rows] == [(0, 0), (0, 1), (0, 2)]
        assert [row.tokens for row in done.rows] == [FakeEngine.expected(r.src_ids) for r in three]
        # both of the second front-end's requests joined at one step and end at one step
        [both] = to_second
        assert isinstance(both, RowsDone)
        assert sorted((row.request_id, row.index) for row in both.rows) == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        ]
        assert len({row.finished_step for row in done.rows + both.rows}) == 2


@pytest.mark.anyio
async def test_a_failed_row_fails_its_request_once_and_the_step_answers_the_others():
    async with served() as core:
        front_end = core.front_end()
        core.engine.reject_sources = {sentence(4, first=9).src_ids}
        failing = [sentence(12, first=20), sentence(4, first=9), sentence(12, first=40)]
        await front_end.send(encode(submit(0, failing, False, 60.0)))
        await front_end.send(encode(submit(1, [sentence(3)], False, 60.0)))
        # the refusal fails request 0 at once; its other rows leave the batch unanswered
        [failed] = await answers(front_end, 1)
        assert isinstance(failed, Failed) and (failed.request_id, failed.kind) == (0, "invalid_row")
        core.engine.allow(20)
        [done] = await answers(front_end, 1)
        assert isinstance(done, RowsDone) and [row.request_id for row in done.rows] == [1]
        await wait_until(lambda: core.engine.active_requests == 0, "the batch empty")
        assert set(core.engine.dropped) >= {0, 2}


@pytest.mark.anyio
async def test_an_aborted_request_is_dropped_and_never_answered():
    async with served() as core:
        front_end = core.front_end()
        await front_end.send(encode(submit(0, [sentence(8)], False, 60.0)))
        await wait_until(core.engine.waiting.is_set, "the row stepping")
        await front_end.send(encode(Abort(0)))
        await front_end.send(encode(submit(1, [sentence(3)], False, 60.0)))
        await wait_until(lambda: core.batcher.queue_depth == 1, "the second request queued")
        core.engine.allow(20)
        [done] = await answers(front_end, 1)
        assert isinstance(done, RowsDone) and [row.request_id for row in done.rows] == [1]
        await wait_until(lambda: core.engine.active_requests == 0, "the batch empty")
        assert core.engine.dropped == [0]
