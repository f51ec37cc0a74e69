"""A front-end started with the plan as it was before a revision swap
(service/engine_core/control.py ``find_cores``, ``PlanDesk``): the old engine cores it names
stopped before it reached them (each retired core says ``Free`` once no front-end it heard
holds it), so no pong can tell it the move; the supervisor answers its ``Locate`` with the
plan's ``Retire`` and it reaches the new revision's cores at once rather than waiting on dead
sockets for ``ENGINE_CORE_WAIT_S``. A model's client whose cores stopped unheard asks too."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from service.engine_core.client import EngineCoreClient
from service.engine_core.control import PlanDesk, find_cores, ping_socket
from service.engine_core.plan import ProcessPlan
from service.engine_core.protocol import (
    CoreLoad,
    EngineCoreInfo,
    Locate,
    Ping,
    Pong,
    Retire,
    ToCore,
    decode_from_supervisor,
    encode,
)
from service.translation.plan_follower import PlanFollower
from service.wiring import ENGINE_CORE_WAIT_S
from tests.engine_core.stand_in import StandInCore

MODEL = "opus-mt-en-fr"
# Far below ENGINE_CORE_WAIT_S, and below the probe's own wait here: a probe that waited on
# the dead sockets would raise, not answer late.
BOUND_S = 3.0
PROBE_WAIT_S = 10 * BOUND_S


class ServingCore(StandInCore):
    """An engine core of the new revision: it answers pings."""

    def answer(self, router: zmq.Socket, peer: bytes, message: ToCore) -> None:
        if isinstance(message, Ping):
            info = EngineCoreInfo(MODEL, "cpu", None, 4)
            pong = Pong(message.sent_at, info, CoreLoad(os.getpid(), True, 0, 0))
            router.send_multipart([peer, encode(pong)])


class Supervisor:
    """The supervisor's loop as far as the desk goes: ``PlanDesk`` answering from ``plan``."""

    def __init__(self, plan: ProcessPlan) -> None:
        self.plan = plan
        self._desk = PlanDesk(plan.supervisor)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._desk.answer(self.plan, wait_s=0.05)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._desk.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def old_plan() -> Iterator[ProcessPlan]:
    run_dir = Path(tempfile.mkdtemp(prefix="mt-desk-"))  # short: ipc paths are bounded
    yield ProcessPlan(1, 1, 1, 2).with_addresses(run_dir, [MODEL])
    shutil.rmtree(run_dir, ignore_errors=True)


def test_a_frontend_started_with_the_old_plan_reaches_the_new_cores_after_the_old_stopped(
    old_plan,
):
    assert PROBE_WAIT_S < ENGINE_CORE_WAIT_S / 10
    run_dir = Path(old_plan.supervisor.removeprefix("ipc://")).parent
    [new_address] = old_plan.generation_addresses(run_dir, 0, 1)
    moved = old_plan.moved(MODEL, [new_address])
    # the old core (generation 0) is gone: nothing is bound at its address
    follower = PlanFollower(old_plan)  # the front-end's command line: the old plan
    with Supervisor(moved), ServingCore(new_address):
        started = time.monotonic()
        addresses, pong = find_cores(MODEL, follower, PROBE_WAIT_S, old_plan.supervisor)
        took_s = time.monotonic() - started
    assert addresses == [new_address] and pong.info.model_id == MODEL
    assert follower.addresses[MODEL] == [new_address]  # a later reload goes there too
    assert took_s < BOUND_S


def answering(desk: PlanDesk, plan: ProcessPlan, for_s: float) -> None:
    until = time.monotonic() + for_s
    while time.monotonic() < until:
        desk.answer(plan, wait_s=0.05)


def test_the_supervisor_answers_only_a_frontend_whose_plan_is_out_of_date(old_plan):
    run_dir = Path(old_plan.supervisor.removeprefix("ipc://")).parent
    [new_address] = old_plan.generation_addresses(run_dir, 0, 1)
    moved = old_plan.moved(MODEL, [new_address])
    desk = PlanDesk(old_plan.supervisor)
    context = zmq.Context()
    frontend = ping_socket(context, old_plan.supervisor, b"frontend-1-test")
    try:
        deadline = time.monotonic() + BOUND_S
        while not frontend.poll(0, zmq.POLLOUT):  # IMMEDIATE: connected first
            assert time.monotonic() < deadline, "the front-end never connected"
            time.sleep(0.01)
        # the cores it knows are the plan's (they may be loading still): no answer, it waits
        frontend.send(encode(Locate(MODEL, [new_address])))
        frontend.send(encode(Locate("not-served", [new_address])))
        answering(desk, moved, 0.3)
        assert not frontend.poll(0)
        frontend.send(encode(Locate(MODEL, old_plan.addresses[MODEL])))
        answering(desk, moved, 0.3)
        assert frontend.poll(0)
        assert decode_from_supervisor(frontend.recv()) == Retire([new_address], moved.version)
    finally:
        frontend.close(linger=0)
        context.term()
        desk.close()


@pytest.mark.anyio
async def test_a_client_whose_cores_stopped_before_it_was_heard_learns_the_move(old_plan):
    run_dir = Path(old_plan.supervisor.removeprefix("ipc://")).parent
    [new_address] = old_plan.generation_addresses(run_dir, 0, 1)
    moved = old_plan.moved(MODEL, [new_address])
    moves: list[tuple[list[str], int]] = []
    client = EngineCoreClient(
        old_plan.addresses[MODEL],  # the old core answered the probe, then stopped
        EngineCoreInfo(MODEL, "cpu", None, 4),
        ping_s=0.02,
        on_moved=lambda at, version: moves.append((at, version)),
        supervisor=old_plan.supervisor,
        ask_s=0.1,
    )
    with Supervisor(moved):
        client.start()
        try:
            deadline = time.monotonic() + BOUND_S
            while not moves:
                assert time.monotonic() < deadline, "the client never learnt the move"
                await asyncio.sleep(0.01)
        finally:
            client.close()
    assert moves[0] == ([new_address], moved.version)
