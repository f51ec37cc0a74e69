"""The GPU session's carry plan: every call within the limit the working tree leaves, and the
parts joined on the far side into the very files that were split."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_carry.py"


def _git_repo(path: Path, tracked_bytes: int) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    (path / "weights.bin").write_bytes(os.urandom(tracked_bytes))
    (path / ".gitignore").write_text(".carry/\n")
    return path


def _plan(repo: Path, files: list[Path], limit_mib: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "plan", "--repo", str(repo), "--out", str(repo / ".carry"),
         "--call-limit-mib", str(limit_mib), *map(str, files)],
        capture_output=True, text=True,
    )  # fmt: skip


def test_parts_fit_each_call_and_join_into_the_original_files(tmp_path: Path) -> None:
    repo = _git_repo(tmp_path / "repo", tracked_bytes=300_000)
    wheel, small = tmp_path / "big.whl", tmp_path / "small.whl"
    wheel.write_bytes(os.urandom(5_000_000))
    small.write_bytes(b"tiny")
    done = _plan(repo, [wheel, small], limit_mib=3)
    assert done.returncode == 0, done.stderr
    budget = 3 * 2**20 - 300_000 - len(".carry/\n") - 2**20  # limit, tree, margin
    calls = sorted((repo / ".carry").glob("call-*"))
    assert len(calls) == -(-5_000_004 // budget)  # as few calls as the budget allows
    assert all(sum(f.stat().st_size for f in call.iterdir()) <= budget for call in calls)

    subprocess.run(["bash", str(repo / ".carry" / "assemble.sh"), str(tmp_path / "joined")],
                   check=True)  # fmt: skip
    assert (tmp_path / "joined" / "big.whl").read_bytes() == wheel.read_bytes()
    assert (tmp_path / "joined" / "small.whl").read_bytes() == b"tiny"


def test_a_damaged_part_fails_the_join(tmp_path: Path) -> None:
    repo = _git_repo(tmp_path / "repo", tracked_bytes=1000)
    wheel = tmp_path / "big.whl"
    wheel.write_bytes(os.urandom(3_000_000))
    assert _plan(repo, [wheel], limit_mib=2).returncode == 0
    part = sorted((repo / ".carry").glob("call-*/big.whl.part-*"))[-1]
    part.write_bytes(b"x" + part.read_bytes()[1:])
    joined = subprocess.run(["bash", str(repo / ".carry" / "assemble.sh"), str(tmp_path / "out")])
    assert joined.returncode != 0


def test_a_tree_that_fills_the_call_is_refused(tmp_path: Path) -> None:
    repo = _git_repo(tmp_path / "repo", tracked_bytes=2 * 2**20)
    wheel = tmp_path / "big.whl"
    wheel.write_bytes(b"wheel")
    done = _plan(repo, [wheel], limit_mib=2)
    assert done.returncode != 0
    assert "nothing can be carried" in done.stderr


@pytest.fixture(autouse=True)
def _quiet_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
