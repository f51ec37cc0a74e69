"""The supervisor's children: ``Child`` (how to start one process, and its current
incarnation), the command lines of the engine cores and the front-ends, and what each child
does first (``die_with_parent``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from service.engine_core.plan import ProcessPlan
from service.translation.exports import ModelSpec

PYTHON = [sys.executable, "-m"]
PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux): a
    supervisor killed with SIGKILL must not leave its children serving."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before the call
            os.kill(os.getpid(), signum)


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


def engine_cores(
    spec: ModelSpec, addresses: list[str], plan: ProcessPlan, label: str
) -> list[Child]:
    """The engine cores of one model, a replica at each address, each with the plan's
    intra-op threads and share of the CPUs; ``label`` ends their names."""
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
                str(plan.intra_op_threads),
                "--cpus",
                str(plan.cpus_per_replica),
            ],
        )
        for replica, address in enumerate(addresses)
    ]


def frontend(index: int, fd: int, plan: ProcessPlan) -> Child:
    """A front-end accepting on the inherited socket ``fd``, started with ``plan``."""
    child = Child(f"front-end {index}", [], (fd,))
    frontend_plan(child, plan)
    return child


def frontend_plan(child: Child, plan: ProcessPlan) -> None:
    """Start the front-end ``child`` with ``plan`` from now on (the plan moved)."""
    fd = str(child.pass_fds[0])
    child.argv = [*PYTHON, "service.processes.frontend", "--fd", fd, "--plan", plan.to_json()]
