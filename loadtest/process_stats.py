"""What the server process uses while a load runs, read from ``/proc`` (Linux only).

* resident memory (``VmRSS``) and open file descriptors, sampled at an interval, so a run can
  say whether memory stayed bounded and descriptors flat;
* CPU time per thread: the main thread runs the event loop (uvicorn serves from it), every
  other thread is engine work (the batcher's engine thread, ONNX Runtime's pool, the worker
  threads that tokenize big requests). Their shares of the process's CPU show whether the
  loop kept enough of the machine to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def stat_fields(stat: str) -> list[str]:
    """The fields of a ``/proc/.../stat`` line after the command name (which may hold spaces
    and ")"): state first, then the parent's pid, ..., utime at 11 and stime at 12."""
    return stat.rsplit(")", 1)[1].split()


def stat_cpu_seconds(stat: str) -> float:
    """User + system CPU seconds in a ``/proc/.../stat`` line."""
    fields = stat_fields(stat)
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of ``pid``, by thread id."""
    times: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return times
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        times[int(tid)] = stat_cpu_seconds(stat)
    return times


def cpu_split(pid: int, before: dict[int, float], after: dict[int, float]) -> dict[str, Any]:
    """CPU seconds spent between two ``thread_cpu_seconds`` readings: the event loop (main
    thread, whose id is the pid) against all other threads."""
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop = spent.get(pid, 0.0)
    others = sum(value for tid, value in spent.items() if tid != pid)
    total = loop + others
    return {
        "loop_cpu_s": round(loop, 2),
        "engine_and_worker_cpu_s": round(others, 2),
        "loop_share": round(loop / total, 3) if total else None,
        "threads": len(after),
    }


@dataclass
class ProcessSampler:
    """Samples RSS and open fds of ``pid`` every ``interval_s`` while ``run`` is awaited."""

    pid: int
    interval_s: float = 1.0
    samples: list[dict[str, float | int | None]] = field(default_factory=list)

    def sample(self, started: float) -> None:
        self.samples.append(
            {
                "t_s": round(time.perf_counter() - started, 2),
                "rss_mb": None if (rss := rss_bytes(self.pid)) is None else round(rss / 2**20, 1),
                "fds": open_fds(self.pid),
            }
        )

    async def run(self, stop: asyncio.Event) -> None:
        started = time.perf_counter()
        while not stop.is_set():
            self.sample(started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
        self.sample(started)

    def summary(self) -> dict[str, Any]:
        rss = [s["rss_mb"] for s in self.samples if s["rss_mb"] is not None]
        fds = [s["fds"] for s in self.samples if s["fds"] is not None]
        if not rss:
            return {"available": False}
        return {
            "available": True,
            "rss_mb_first": rss[0],
            "rss_mb_peak": max(rss),
            "rss_mb_last": rss[-1],
            "fds_first": fds[0] if fds else None,
            "fds_peak": max(fds) if fds else None,
            "fds_last": fds[-1] if fds else None,
            "samples": len(rss),
        }
