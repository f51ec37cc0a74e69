"""Where a Python thread spends the interpreter lock, sampled from outside the process (py-spy).

Why not the in-process sampler alone (bench/request_stages.py, ``StageSampler``): it needs the
interpreter lock to read stacks, so it reads them when a thread lets the lock go, and a thread
lets it go in the C calls that release it (``os.stat``, SentencePiece's ``Encode``, a log line's
``write``) as well as at the switch interval. On one core under load the lock passes to the
engine thread at each such call, so those calls collect the CPU of the whole interval before
them (SentencePiece's ``Encode`` was charged some thirty times what it costs timed alone:
docs/benchmarks-log.md). py-spy reads the stacks from another process without the lock, and
``--gil`` keeps only the samples of the thread that holds it: the event loop's Python, where a
request's web, JSON and text stages run. Its lock-free C calls (a ``stat``, an ``Encode``)
are left out, a few microseconds a request; the engine thread's ONNX Runtime calls run without
the lock, so its split stays the in-process sampler's (encoder and decoder calls are long and
few).

    sampler = GilSampler(pid, seconds, cpus="1").start()
    ...  # the load
    shares = stage_shares(sampler.wait(), "MainThread", stage_of_frames)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

# "Class.method (path/file.py:123)": py-spy's raw frame, paths short (site-packages cut off)
_FRAME = re.compile(r"^(?P<name>.*) \((?P<path>.*?):\d+\)$")


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter (the venv's) or on PATH, or None."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class GilSampler:
    """``py-spy record --gil`` of one process for ``seconds``, pinned to ``cpus``."""

    def __init__(self, pid: int, seconds: float, cpus: str, rate_hz: int = 250) -> None:
        executable = py_spy()
        if executable is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        self.output = Path(tempfile.mkdtemp(prefix="gil-")) / "stacks.txt"
        self.command = [
            "taskset", "-c", cpus, executable, "record", "--pid", str(pid),
            "--duration", str(max(1, round(seconds))), "--rate", str(rate_hz),
            "--format", "raw", "--threads", "--gil", "--nonblocking", "-o", str(self.output),
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> GilSampler:
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        return self

    def wait(self, timeout_s: float = 60.0) -> list[tuple[str, list[tuple[str, str]], int]]:
        """(thread name, frames outermost first as (function, path), samples) per stack."""
        assert self.process is not None, "start() first"
        _, errors = self.process.communicate(timeout=timeout_s)
        if not self.output.exists():
            raise RuntimeError(f"py-spy wrote nothing: {errors.decode(errors='replace')[-500:]}")
        stacks = parse_raw(self.output.read_text())
        shutil.rmtree(self.output.parent, ignore_errors=True)
        return stacks


def parse_raw(text: str) -> list[tuple[str, list[tuple[str, str]], int]]:
    """py-spy's raw (collapsed) lines with ``--threads``:
    ``thread (TID): NAME;frame;frame COUNT``."""
    stacks = []
    for line in text.splitlines():
        head, separator, rest = line.partition(": ")
        if not separator or not head.startswith("thread"):
            continue
        stack, _, count = rest.rpartition(" ")
        if not count.isdigit():  # a frame name with a line break in it splits its line
            continue
        thread, *frames = stack.split(";")
        parsed = []
        for frame in frames:
            match = _FRAME.match(frame)
            parsed.append((match["name"], match["path"]) if match else (frame, ""))
        stacks.append((thread, parsed, int(count)))
    return stacks


def stage_shares(
    stacks: list[tuple[str, list[tuple[str, str]], int]],
    thread: str,
    stage_of: Callable[[list[tuple[str, str]]], str],
) -> dict[str, float]:
    """Each stage's share of ``thread``'s samples (summing to 1; empty without samples)."""
    counts: Counter[str] = Counter()
    for name, frames, count in stacks:
        if name == thread:
            counts[stage_of(frames)] += count
    total = sum(counts.values())
    return {stage: count / total for stage, count in counts.items()} if total else {}
