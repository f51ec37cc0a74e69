"""The process plan: how many HTTP front-ends, how many engine-core replicas per model, and
how many intra-op threads each replica runs, from the CPUs this container may use.

As CTranslate2 sizes its replica pool (``inter_threads`` x ``intra_threads``): a decoder
step of a small batch does not spread well over many threads, so past a few threads another
replica (its own batch, its own step loop, its own interpreter) does more than more threads
in one. A front-end costs about a millisecond of CPU per request (parsing, validation,
tokenization), so one front-end per four CPUs; the engine cores share the rest. On a GPU one
engine core drives the device. Each count can be set instead
(``MT_FRONTENDS``, ``MT_ENGINE_REPLICAS``, ``MT_INTRA_OP_THREADS``; 0 keeps the automatic one).

The plan travels to the front-ends as a JSON file: the engine cores' socket addresses by
model, so every front-end reaches every replica. A new revision of an installed model runs in
engine cores of a new generation (a number in their sockets' names): the supervisor replaces
the file with a plan of the next version that names them (service/processes/swaps.py), and each
front-end follows it (``PublishedPlan``) and acknowledges the version it has moved to.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from service.cpus import CpuBudget

logger = logging.getLogger(__name__)

CPUS_PER_FRONTEND = 4
THREADS_PER_REPLICA = 4


@dataclass(frozen=True)
class ProcessPlan:
    frontends: int
    engine_replicas: int  # per model
    intra_op_threads: int  # per replica
    cpus: int  # the budget the plan was made for
    # model id -> the replicas' socket addresses (ipc://...)
    addresses: dict[str, list[str]] = field(default_factory=dict)
    version: int = 0  # one more each time a model moves to engine cores of a new revision

    @property
    def cpus_per_replica(self) -> int:
        """The CPUs each engine core may count as its own: the budget less the front-ends',
        shared among the replicas of one model (it decides whether the encoder thread of each
        has a core to itself)."""
        return max(1, (self.cpus - self.frontends) // self.engine_replicas)

    def describe(self) -> str:
        return (
            f"{self.frontends} front-end(s), {self.engine_replicas} engine core(s) per model x "
            f"{self.intra_op_threads} intra-op thread(s), for {self.cpus} CPUs"
        )

    def with_addresses(self, run_dir: Path, model_ids: list[str]) -> ProcessPlan:
        """The plan with an ipc socket under ``run_dir`` for each replica of each model."""
        addresses = {
            model_id: self.generation_addresses(run_dir, index, 0)
            for index, model_id in enumerate(model_ids)
        }
        return replace(self, addresses=addresses)

    def generation_addresses(self, run_dir: Path, model_index: int, generation: int) -> list[str]:
        """The sockets of the replicas of one model's engine cores of ``generation``."""
        return [
            f"ipc://{run_dir / f'engine-{model_index}-{replica}-g{generation}.sock'}"
            for replica in range(self.engine_replicas)
        ]

    def moved(self, model_id: str, addresses: list[str]) -> ProcessPlan:
        """The next version of the plan, where ``model_id`` runs at ``addresses``."""
        return replace(
            self, addresses={**self.addresses, model_id: addresses}, version=self.version + 1
        )

    def save(self, path: Path) -> None:
        """Write the plan at ``path`` at once (a rename): a front-end that reads it meanwhile
        reads the old plan or the new, never part of one."""
        write_atomically(path, json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> ProcessPlan:
        return cls(**json.loads(path.read_text()))


def runs_split(mode: str, budget: CpuBudget, gpu: bool) -> bool:
    """``MT_PROCESS_MODE`` resolved: whether front-ends and engine cores run as processes of
    their own. ``auto`` splits with a GPU, or once a front-end can have a CPU without taking
    it from the engine (``CPUS_PER_FRONTEND``). Below that one process does as much or more:
    the split adds the messages and a second interpreter, and on two CPUs a CPU held for the
    front-end (a fifth of a request's CPU) is a CPU the engine lacks, while giving the engine
    both puts its spinning threads against the front-end."""
    if mode != "auto":
        return mode == "multi"
    return gpu or budget.cpus >= CPUS_PER_FRONTEND


def plan_processes(
    budget: CpuBudget,
    frontends: int = 0,
    engine_replicas: int = 0,
    intra_op_threads: int = 0,
    gpu: bool = False,
) -> ProcessPlan:
    """The plan for ``budget``; a count given (not 0) is taken as it is."""
    cpus = budget.cpus
    frontends = frontends or max(1, cpus // CPUS_PER_FRONTEND)
    engine_cpus = max(1, cpus - frontends)
    if not engine_replicas:
        engine_replicas = 1 if gpu else max(1, round(engine_cpus / THREADS_PER_REPLICA))
    threads = intra_op_threads or max(1, engine_cpus // engine_replicas)
    return ProcessPlan(frontends, engine_replicas, threads, cpus)


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)


def acknowledgement_path(plan_path: Path, pid: int) -> Path:
    """Where the front-end ``pid`` says which version of the plan it has moved to."""
    return plan_path.parent / "acks" / str(pid)


def acknowledged_version(plan_path: Path, pid: int) -> int:
    """The plan version the front-end ``pid`` has moved to (-1: none said yet)."""
    try:
        return int(acknowledgement_path(plan_path, pid).read_text())
    except (OSError, ValueError):
        return -1


class PublishedPlan:
    """The supervisor's plan as a front-end follows it: the plan now (read again from its
    file once the supervisor replaced it), and the version this front-end has moved to.

    ``path`` None: a plan given as it is, which never moves."""

    def __init__(self, plan: ProcessPlan, path: Path | None = None) -> None:
        self.current = plan
        self.path = path
        self._acknowledged = -1

    @classmethod
    def load(cls, path: Path) -> PublishedPlan:
        return cls(ProcessPlan.load(path), path)

    def refresh(self) -> None:
        """Read the file again; a plan that cannot be read leaves the one in use."""
        if self.path is None:
            return
        try:
            plan = ProcessPlan.load(self.path)
        except (OSError, ValueError, TypeError) as error:
            logger.warning(
                "the process plan %s cannot be read (%s); keeping version %d",
                self.path,
                error,
                self.current.version,
            )
            return
        if plan.version > self.current.version:
            logger.info("process plan version %d: engine cores moved", plan.version)
            self.current = plan

    def acknowledge(self) -> None:
        """Tell the supervisor that this front-end sends nothing any more to engine cores the
        current plan does not name (so it may stop them)."""
        version = self.current.version
        if self.path is None or version == self._acknowledged:
            return
        path = acknowledgement_path(self.path, os.getpid())
        path.parent.mkdir(exist_ok=True)
        write_atomically(path, str(version))
        self._acknowledged = version
