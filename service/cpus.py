"""How many CPUs this process may really use: the affinity mask intersected with the
container's CPU quota.

``os.sched_getaffinity`` sees the cores a process may be scheduled on, not how much time it
may spend on them: ``docker run --cpus 2`` or a Kubernetes CPU limit of 2 on a 16-core node
leaves the mask at 16 CPUs and throttles the process to 2 CPUs' worth of time per period.
Sizing ONNX Runtime's thread pool, the encoder overlap and admission by the mask then starts
15 threads that fight over 2 CPUs of quota. So the count here is the smaller of the mask and
the quota (rounded up: 1.5 CPUs of quota can keep 2 threads partly busy, and the event loop
takes the remainder):

* cgroup v2: ``cpu.max`` holds ``"<quota> <period>"`` or ``"max <period>"`` (no limit);
* cgroup v1: ``cpu.cfs_quota_us`` (``-1``: no limit) and ``cpu.cfs_period_us``.

The cgroup of this process is read from ``/proc/self/cgroup``; the mount point is a parameter
so that tests can hand in a fake tree.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs this process may use and where the number comes from."""

    cpus: int  # min(affinity, ceil(quota)), at least 1
    affinity: int  # CPUs in the scheduler's mask
    quota: float | None  # CPUs of time per period granted by the cgroup; None: no quota
    source: str  # "affinity" or "cgroup v2" / "cgroup v1"

    @property
    def engine_threads(self) -> int:
        """ONNX Runtime intra-op threads that leave the HTTP event loop a core (at least 1)."""
        return max(1, self.cpus - 1)

    def describe(self) -> str:
        quota = "no quota" if self.quota is None else f"quota {self.quota:g} CPUs ({self.source})"
        return f"{self.cpus} CPUs: affinity {self.affinity}, {quota}"


def affinity_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_paths(proc_cgroup: Path) -> dict[str, str]:
    """Controller -> this process's cgroup path (``""`` is the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _candidates(root: Path, path: str | None) -> list[Path]:
    """The process's own cgroup directory first (where visible), then the mount root (inside
    a container the cgroup namespace makes the root the container's own cgroup)."""
    found = []
    if path:
        found.append(root / path.lstrip("/"))
    found.append(root)
    return found


def _v2_quota(root: Path, path: str | None) -> float | None:
    for directory in _candidates(root, path):
        text = _read(directory / "cpu.max")
        if text is None:
            continue
        quota, _, period = text.partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period)
    return None


def _v1_quota(root: Path, path: str | None) -> float | None:
    for base in (root / "cpu,cpuacct", root / "cpu"):
        for directory in _candidates(base, path):
            quota = _read(directory / "cpu.cfs_quota_us")
            period = _read(directory / "cpu.cfs_period_us")
            if quota is None or period is None:
                continue
            if int(quota) <= 0:
                return None
            return int(quota) / int(period)
    return None


def cpu_budget(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP, affinity: int | None = None
) -> CpuBudget:
    """The CPUs this process may use: the affinity mask, capped by a cgroup CPU quota."""
    mask = affinity if affinity is not None else affinity_cpus()
    paths = _cgroup_paths(proc_cgroup)
    quota, source = None, "affinity"
    try:
        if (root / "cgroup.controllers").exists() or "" in paths:
            quota, source = _v2_quota(root, paths.get("")), "cgroup v2"
        if quota is None:
            quota, source = _v1_quota(root, paths.get("cpu")), "cgroup v1"
    except ValueError:  # an unreadable number: trust the mask
        quota = None
    if quota is None:
        return CpuBudget(mask, mask, None, "affinity")
    return CpuBudget(max(1, min(mask, math.ceil(quota))), mask, quota, source)


def spare_core(cpus: int) -> bool:
    """Whether an engine core given ``cpus`` CPUs can give the encoder thread a core of its
    own: with one, the encoder would only take turns with the engine thread, so it runs in
    line."""
    return cpus >= 2
