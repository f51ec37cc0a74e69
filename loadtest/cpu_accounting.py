"""CPU seconds per request by process kind in the multi-process service, read from ``/proc``
(Linux only), and the capacity they project on a machine with more cores.

The service is a process tree: the supervisor (``python -m service``), its HTTP front-ends
(``service.processes.frontend``) and its engine cores (``service.processes.engine_process``).
``snapshot`` reads each process's user + system time (``/proc/<pid>/stat``) and its busiest
thread's; two snapshots around a load window and the number of requests answered in it give
each kind's CPU-seconds per request. In the one-process mode the tree is the one process
(kind ``service``).

The projection: were every process kind free to spread over more cores, C cores would answer
about C / (total CPU-seconds per request) requests a second; one process's share of a request
does not spread over more processes, so it caps that at 1 / (its CPU-seconds per request).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.process_stats import stat_cpu_seconds, stat_fields, thread_cpu_seconds

PROC = Path("/proc")
KINDS = {
    "service.processes.frontend": "frontend",
    "service.processes.engine_process": "engine_core",
}


@dataclass(frozen=True)
class ProcessCpu:
    pid: int
    kind: str
    cpu_s: float  # user + system of all its threads
    threads: dict[int, float]  # thread id -> CPU seconds


def process_cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads); None once it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat_cpu_seconds(stat)


def child_pids(pid: int, proc: Path = PROC) -> list[int]:
    """The children of ``pid``: every thread's ``children`` list where the kernel has them
    (``CONFIG_PROC_CHILDREN``), else each process's parent in ``/proc/*/stat``."""
    found: set[int] = set()
    try:
        lists = [task / "children" for task in (proc / str(pid) / "task").iterdir()]
    except OSError:
        return []
    if lists and all(path.exists() for path in lists):
        for path in lists:
            try:
                found.update(int(child) for child in path.read_text().split())
            except OSError:
                continue  # the thread ended meanwhile
        return sorted(found)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields((entry / "stat").read_text())
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return sorted(found)


def kind_of(command_line: str) -> str | None:
    """The process kind a child's command line names; None for anything else."""
    for module, kind in KINDS.items():
        if module in command_line:
            return kind
    return None


def service_processes(root: int, proc: Path = PROC) -> dict[int, str]:
    """pid -> kind for the service started as ``root`` and its front-ends and engine cores."""
    processes: dict[int, str] = {}
    for pid in child_pids(root, proc):
        try:
            command = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if (kind := kind_of(command)) is not None:
            processes[pid] = kind
    processes[root] = "supervisor" if processes else "service"
    return processes


def snapshot(root: int, proc: Path = PROC) -> list[ProcessCpu]:
    """Every service process's CPU seconds now."""
    found = []
    for pid, kind in service_processes(root, proc).items():
        cpu_s = process_cpu_seconds(pid, proc)
        if cpu_s is not None:
            found.append(ProcessCpu(pid, kind, cpu_s, thread_cpu_seconds(pid)))
    return found


def cpu_by_kind(
    before: Sequence[ProcessCpu], after: Sequence[ProcessCpu], requests: int, window_s: float
) -> dict[str, Any]:
    """CPU spent between two snapshots, per process kind and per request. A process that
    started in between (a restart) counts from zero; one that ended has taken its time with
    it (``processes_gone`` says how many)."""
    earlier = {process.pid: process for process in before}
    kinds: dict[str, dict[str, Any]] = {}
    for process in after:
        previous = earlier.get(process.pid)
        spent = process.cpu_s - (previous.cpu_s if previous else 0.0)
        thread_spent = max(
            (
                cpu - (previous.threads.get(tid, 0.0) if previous else 0.0)
                for tid, cpu in process.threads.items()
            ),
            default=0.0,
        )
        entry = kinds.setdefault(
            process.kind,
            {
                "processes": 0,
                "cpu_s": 0.0,
                "busiest_process_cpu_s": 0.0,
                "busiest_thread_cpu_s": 0.0,
            },
        )
        entry["processes"] += 1
        entry["cpu_s"] += spent
        entry["busiest_process_cpu_s"] = max(entry["busiest_process_cpu_s"], spent)
        entry["busiest_thread_cpu_s"] = max(entry["busiest_thread_cpu_s"], thread_spent)
    per_request = 1.0 / requests if requests else 0.0
    for entry in kinds.values():
        entry["cpu_s_per_request"] = entry["cpu_s"] * per_request
        entry["busiest_process_cpu_s_per_request"] = entry["busiest_process_cpu_s"] * per_request
        entry["busiest_thread_cpu_s_per_request"] = entry["busiest_thread_cpu_s"] * per_request
        entry["cores_busy"] = entry["cpu_s"] / window_s if window_s else None
    total = sum(entry["cpu_s"] for entry in kinds.values())
    return {
        "requests": requests,
        "window_s": window_s,
        "by_kind": kinds,
        "total_cpu_s": total,
        "total_cpu_s_per_request": total * per_request,
        "serial_cpu_s_per_request": max(
            (e["busiest_process_cpu_s_per_request"] for e in kinds.values()), default=0.0
        ),
        "busiest_thread_cpu_s_per_request": max(
            (e["busiest_thread_cpu_s_per_request"] for e in kinds.values()), default=0.0
        ),
        "processes_gone": len(set(earlier) - {process.pid for process in after}),
    }


def projected_capacity(
    cores: Iterable[int], cpu_s_per_request: float, serial_cpu_s_per_request: float
) -> dict[int, dict[str, float | bool | None]]:
    """Requests a second on each core count: cores / CPU-seconds per request, capped by
    1 / the serial share (the CPU-seconds per request of the one process that does not
    spread); ``capped`` says which bound decides. None where nothing was measured."""
    cap = 1.0 / serial_cpu_s_per_request if serial_cpu_s_per_request > 0 else None
    projection: dict[int, dict[str, float | bool | None]] = {}
    for count in cores:
        spread = count / cpu_s_per_request if cpu_s_per_request > 0 else None
        bounds = [bound for bound in (spread, cap) if bound is not None]
        projection[count] = {
            "rps": min(bounds) if bounds else None,
            "spread_rps": spread,
            "serial_cap_rps": cap,
            "capped": cap is not None and spread is not None and cap < spread,
        }
    return projection
