"""The supervisor's children: ``Child`` (how to start one process, and its current
incarnation) and the command lines of the engine cores and the front-ends."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from service.translation.exports import ModelSpec

PYTHON = [sys.executable, "-m"]


@dataclass(eq=False)
class Child:
    """One supervised process: how to start it, and its current incarnation."""

    name: str
    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0  # deaths in a row, each soon after its start
    start_after: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def engine_cores(spec: ModelSpec, addresses: list[str], threads: int, label: str) -> list[Child]:
    """The engine cores of one model, a replica at each address; ``label`` ends their names."""
    return [
        Child(
            f"engine core {spec.model_id}/{replica}{label}",
            [
                *PYTHON,
                "service.processes.engine_process",
                "--model-id",
                spec.model_id,
                "--model-dir",
                str(spec.model_dir),
                "--address",
                address,
                "--threads",
                str(threads),
            ],
        )
        for replica, address in enumerate(addresses)
    ]


def frontend(index: int, fd: int, plan_path: Path) -> Child:
    """A front-end accepting on the inherited socket ``fd``, following the plan at
    ``plan_path``."""
    argv = [*PYTHON, "service.processes.frontend", "--fd", str(fd), "--plan", str(plan_path)]
    return Child(f"front-end {index}", argv, (fd,))
