"""The supervisor's side of a new revision in the multi-process service
(service/processes/swaps.py), piece by piece: a new revision whose engine core cannot load
leaves the old one serving and is not tried again; once the new cores answer, the old ones get
``Retire`` and stop only once they say ``Free`` (or after the backstop); a front-end follows
the moves its clients hear, and one restarted gets the plan as it is now. The messages on a
real engine core are in tests/engine_core/test_control_messages.py, the whole swap under load
in tests/models_cli/test_models_cli.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from service.engine_core.plan import ProcessPlan
from service.engine_core.protocol import (
    CoreLoad,
    EngineCoreInfo,
    Free,
    Ping,
    Pong,
    Retire,
    ToCore,
    encode,
)
from service.processes import supervisor as supervisor_module
from service.processes.children import Child
from service.processes.supervisor import Supervisor, listen
from service.processes.swaps import Generation, RevisionSwaps
from service.translation.exports import MANIFEST_FILE, model_spec
from service.translation.plan_follower import PlanFollower
from tests.engine_core.stand_in import StandInCore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mt-swap-"))  # short: ipc paths are bounded
    yield path
    shutil.rmtree(path, ignore_errors=True)


def installed(model_dir: Path, revision: str) -> None:
    """A model directory as ``models pull`` leaves it, as far as discovery reads it (no ONNX
    files: an engine core of it fails to load)."""
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "fr"}))
    (model_dir / MANIFEST_FILE).write_text(json.dumps({"revision": revision}))


@pytest.fixture
def closing() -> Iterator[Callable[[RevisionSwaps], RevisionSwaps]]:
    """Closes each ``RevisionSwaps`` handed to it at the test's end, failed or not: a control
    socket's context left to the garbage collector blocks it (its sockets' weak references are
    gone before the context's finaliser terminates it)."""
    opened: list[RevisionSwaps] = []

    def close_at_the_end(swaps: RevisionSwaps) -> RevisionSwaps:
        opened.append(swaps)
        return swaps

    yield close_at_the_end
    for swaps in opened:
        swaps.close()


def swaps_of(run_dir: Path, model_dir: Path, started: list[Child]) -> RevisionSwaps:
    spec = model_spec(model_dir, "")
    plan = ProcessPlan(1, 1, 1, 2).with_addresses(run_dir, [spec.model_id])

    def start(child: Child) -> None:
        child.process = subprocess.Popen(
            child.argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        started.append(child)

    return RevisionSwaps(plan, run_dir, [spec], start, 0.01, 1.0, 1.0)


def test_a_new_revision_that_cannot_load_leaves_the_old_one_serving(run_dir, caplog, closing):
    model_dir = run_dir / "opus-mt-en-fr"
    installed(model_dir, "first")
    started: list[Child] = []
    swaps = closing(swaps_of(run_dir, model_dir, started))
    installed(model_dir, "broken")
    caplog.set_level(logging.INFO, logger="service.processes.swaps")
    deadline = time.monotonic() + 60
    while not started or swaps.loading:
        assert time.monotonic() < deadline, "the new engine core neither loaded nor failed"
        swaps.tick()
        time.sleep(0.02)
    [new_core] = started
    assert "g1.sock" in " ".join(new_core.argv) and not new_core.running
    assert swaps.failed == {"opus-mt-en-fr": "broken"}
    assert swaps.current["opus-mt-en-fr"].revision == "first"
    assert swaps.plan.version == 0  # the front-ends stay
    assert "loading revision broken failed" in caplog.text
    assert "revision first serves on" in caplog.text
    for _ in range(5):  # not tried again until the revision changes
        swaps.tick()
        time.sleep(0.02)
    assert len(started) == 1 and not swaps.loading


def sleeper() -> Child:
    child = Child("engine core m/0", [])
    child.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return child


class FakeCore(StandInCore):
    """An engine core's socket at ``address`` as the supervisor sees it: it answers pings,
    keeps the ``Retire`` it gets, and says ``Free`` when told."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.orders: list[Retire] = []
        self.say_free = threading.Event()
        self._supervisor: bytes | None = None
        self._freed = False

    def answer(self, router: zmq.Socket, peer: bytes, message: ToCore) -> None:
        if isinstance(message, Ping):
            info = EngineCoreInfo("opus-mt-en-fr", "cpu", None, 4)
            pong = Pong(message.sent_at, info, CoreLoad(os.getpid(), True, 0, 0))
            router.send_multipart([peer, encode(pong)])
        elif isinstance(message, Retire):
            self._supervisor = peer
            self.orders.append(message)

    def between(self, router: zmq.Socket) -> None:
        if self._supervisor is not None and self.say_free.is_set() and not self._freed:
            self._freed = True
            free = Free(self.orders[-1].plan_version)
            router.send_multipart([self._supervisor, encode(free)])


def test_old_engine_cores_get_retire_once_the_new_ones_answer_and_stop_once_they_say_free(
    run_dir, closing
):
    model_dir = run_dir / "opus-mt-en-fr"
    installed(model_dir, "first")
    new_cores: list[Child] = []
    swaps = closing(swaps_of(run_dir, model_dir, new_cores))

    def start(child: Child) -> None:  # a process that only lives: a fake core answers for it
        child.process = sleeper().process
        new_cores.append(child)

    swaps.start = start
    old = swaps.current["opus-mt-en-fr"]
    old.children = [sleeper()]
    [old_address] = old.addresses
    [new_address] = swaps.plan.generation_addresses(run_dir, 0, 1)
    installed(model_dir, "second")
    with FakeCore(old_address) as old_core, FakeCore(new_address):
        deadline = time.monotonic() + 10
        while not old_core.orders:
            assert time.monotonic() < deadline, "the old engine core never got Retire"
            swaps.tick()
            time.sleep(0.02)
        assert old_core.orders == [Retire([new_address], 1)]
        assert swaps.plan.version == 1 and swaps.plan.addresses["opus-mt-en-fr"] == [new_address]
        assert swaps.retiring == [old]
        for _ in range(10):
            swaps.tick()
            time.sleep(0.02)
        assert old.children[0].running  # no Free yet: a front-end holds it
        old_core.say_free.set()
        deadline = time.monotonic() + 10
        while swaps.retiring:
            assert time.monotonic() < deadline, "the old engine core never stopped"
            swaps.tick()
            time.sleep(0.02)
    assert old.children[0].process is not None and old.children[0].process.returncode == -15
    assert new_cores[0].running  # the new one serves on
    new_cores[0].process.kill()  # type: ignore[union-attr]
    swaps.close()


def test_old_engine_cores_stop_without_their_free_after_the_backstop(run_dir, closing):
    model_dir = run_dir / "opus-mt-en-fr"
    installed(model_dir, "first")
    swaps = closing(swaps_of(run_dir, model_dir, []))
    old = Generation(swaps.specs[0], 0, "first", ["ipc://old"], [sleeper()], retired_in=1)
    old.stop_by = time.monotonic() - 1  # the backstop's wait is over
    swaps.retiring.append(old)
    deadline = time.monotonic() + 10
    while swaps.retiring:
        assert time.monotonic() < deadline, "the old engine core never stopped"
        swaps.tick()  # no core ever says Free
        time.sleep(0.02)
    assert not old.children[0].running
    swaps.close()


def test_a_frontend_follows_each_models_newer_move_and_swaps_at_once():
    plan = ProcessPlan(1, 1, 1, 2, {"a": ["ipc://a0"], "b": ["ipc://b0"]}, version=3)
    follower = PlanFollower(plan)
    woken: list[int] = []
    follower.wake = lambda: woken.append(1)
    follower.moved("a", ["ipc://a1"], 5)
    follower.moved("b", ["ipc://b1"], 4)  # heard after a's later move: news all the same
    follower.moved("a", ["ipc://a0"], 3)  # an old core's stale word
    assert follower.addresses == {"a": ["ipc://a1"], "b": ["ipc://b1"]}
    assert len(woken) == 2


def test_a_restarted_frontend_starts_with_the_plan_as_it_is_now(run_dir, monkeypatch):
    model_dir = run_dir / "opus-mt-en-fr"
    installed(model_dir, "first")
    spec = model_spec(model_dir, "")
    plan = ProcessPlan(1, 1, 1, 2).with_addresses(run_dir, [spec.model_id])
    listener = listen("127.0.0.1", 0)
    supervisor = Supervisor(plan, [spec], listener, run_dir, {}, 1.0)
    started: list[list[str]] = []

    class Recorded:
        def __init__(self, argv: list[str], **kwargs: object) -> None:
            started.append(argv)
            self.pid = 0

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", Recorded)
    try:
        [frontend] = supervisor.frontends
        supervisor._start(frontend)
        moved = supervisor.swaps.plan = plan.moved(spec.model_id, ["ipc://new"])
        supervisor._start(frontend)  # restarted after the move
    finally:
        supervisor.swaps.close()
        listener.close()
    plans = [ProcessPlan.from_json(argv[argv.index("--plan") + 1]) for argv in started]
    assert plans == [plan, moved]
