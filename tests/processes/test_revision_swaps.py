"""The supervisor's side of a new revision in the multi-process service
(service/processes/swaps.py), piece by piece: a new revision whose engine core cannot load
leaves the old one serving and is not tried again; old engine cores stop only once every live
front-end has acknowledged the plan that moved away from them; a front-end follows the plan
file and acknowledges it. The whole swap under load is in tests/models_cli/test_models_cli.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.engine_core.plan import ProcessPlan, PublishedPlan, acknowledged_version
from service.processes.children import Child
from service.processes.swaps import Generation, RevisionSwaps
from service.translation.exports import MANIFEST_FILE, model_spec

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


def swaps_of(run_dir: Path, model_dir: Path, started: list[Child]) -> RevisionSwaps:
    spec = model_spec(model_dir, "")
    plan = ProcessPlan(1, 1, 1, 2).with_addresses(run_dir, [spec.model_id])

    def start(child: Child) -> None:
        child.process = subprocess.Popen(
            child.argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        started.append(child)

    return RevisionSwaps(plan, run_dir / "plan.json", run_dir, [spec], start, 0.01, 1.0, 1.0)


def test_a_new_revision_that_cannot_load_leaves_the_old_one_serving(run_dir, caplog):
    model_dir = run_dir / "opus-mt-en-fr"
    installed(model_dir, "first")
    started: list[Child] = []
    swaps = swaps_of(run_dir, model_dir, started)
    installed(model_dir, "broken")
    caplog.set_level(logging.INFO, logger="service.processes.swaps")
    deadline = time.monotonic() + 60
    while not started or swaps.loading:
        assert time.monotonic() < deadline, "the new engine core neither loaded nor failed"
        swaps.tick([])
        time.sleep(0.02)
    [new_core] = started
    assert "g1.sock" in " ".join(new_core.argv) and not new_core.running
    assert swaps.failed == {"opus-mt-en-fr": "broken"}
    assert swaps.current["opus-mt-en-fr"].revision == "first"
    assert ProcessPlan.load(run_dir / "plan.json").version == 0  # the front-ends stay
    assert "loading revision broken failed" in caplog.text
    assert "revision first serves on" in caplog.text
    for _ in range(5):  # not tried again until the revision changes
        swaps.tick([])
        time.sleep(0.02)
    assert len(started) == 1 and not swaps.loading


def sleeper() -> Child:
    child = Child("engine core m/0", [])
    child.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return child


def test_old_engine_cores_stop_once_every_live_frontend_acknowledged(run_dir):
    model_dir = run_dir / "opus-mt-en-fr"
    installed(model_dir, "first")
    swaps = swaps_of(run_dir, model_dir, [])
    old = swaps.current["opus-mt-en-fr"]
    old.children = [sleeper()]
    swaps.plan = swaps.plan.moved("opus-mt-en-fr", ["ipc://elsewhere"])
    swaps.plan.save(swaps.plan_path)
    old.retired_in, old.stop_by = swaps.plan.version, time.monotonic() + 60
    swaps.retiring.append(old)
    follower = PublishedPlan.load(swaps.plan_path)  # a front-end: this process
    for _ in range(3):
        swaps.tick([os.getpid(), None])  # None: a front-end being restarted
        time.sleep(0.02)
    assert old.children[0].running  # this front-end has not acknowledged version 1
    follower.acknowledge()
    assert acknowledged_version(swaps.plan_path, os.getpid()) == 1
    deadline = time.monotonic() + 10
    while swaps.retiring:
        assert time.monotonic() < deadline, "the old engine core never stopped"
        swaps.tick([os.getpid()])
        time.sleep(0.02)
    assert old.children[0].process is not None and old.children[0].process.returncode == -15


def test_old_engine_cores_stop_without_an_acknowledgement_after_the_wait(run_dir):
    model_dir = run_dir / "opus-mt-en-fr"
    installed(model_dir, "first")
    swaps = swaps_of(run_dir, model_dir, [])
    old = Generation(swaps.specs[0], 0, "first", [], [sleeper()], retired_in=1)
    old.stop_by = time.monotonic() - 1  # the wait is over
    swaps.retiring.append(old)
    deadline = time.monotonic() + 10
    while swaps.retiring:
        assert time.monotonic() < deadline, "the old engine core never stopped"
        swaps.tick([os.getpid()])  # a front-end that never acknowledges
        time.sleep(0.02)
    assert not old.children[0].running


def test_a_frontend_follows_a_newer_plan_and_ignores_an_unreadable_one(run_dir):
    path = run_dir / "plan.json"
    plan = ProcessPlan(1, 1, 1, 2).with_addresses(run_dir, ["m"])
    plan.save(path)
    followed = PublishedPlan.load(path)
    moved = plan.moved("m", ["ipc://new"])
    moved.save(path)
    followed.refresh()
    assert followed.current == moved and followed.current.version == 1
    path.write_text("{")
    followed.refresh()
    assert followed.current == moved
    followed.acknowledge()
    assert acknowledged_version(path, os.getpid()) == 1
