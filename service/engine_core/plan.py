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
model, so every front-end reaches every replica.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from service.cpus import CpuBudget

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

    def describe(self) -> str:
        return (
            f"{self.frontends} front-end(s), {self.engine_replicas} engine core(s) per model x "
            f"{self.intra_op_threads} intra-op thread(s), for {self.cpus} CPUs"
        )

    def with_addresses(self, run_dir: Path, model_ids: list[str]) -> ProcessPlan:
        """The plan with an ipc socket under ``run_dir`` for each replica of each model."""
        addresses = {
            model_id: [
                f"ipc://{run_dir / f'engine-{index}-{replica}.sock'}"
                for replica in range(self.engine_replicas)
            ]
            for index, model_id in enumerate(model_ids)
        }
        return ProcessPlan(
            self.frontends, self.engine_replicas, self.intra_op_threads, self.cpus, addresses
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

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
