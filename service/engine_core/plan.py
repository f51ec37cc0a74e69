"""The process plan: how many HTTP front-ends, how many engine-core replicas per model, and
how many intra-op threads each replica runs, from the CPUs this container may use.

As CTranslate2 sizes its replica pool (``inter_threads`` x ``intra_threads``): a decoder
step of a small batch does not spread well over many threads, so past a few threads another
replica (its own batch, its own step loop, its own interpreter) does more than more threads
in one. A front-end costs about a millisecond of CPU per request (parsing, validation,
tokenization), so one front-end per four CPUs; the engine cores share the rest. On a GPU one
engine core drives the device. Each count can be set instead
(``MT_FRONTENDS``, ``MT_ENGINE_REPLICAS``, ``MT_INTRA_OP_THREADS``; 0 keeps the automatic one).

The supervisor owns the plan; it travels to each front-end on its command line (JSON): the
engine cores' socket addresses by model, so every front-end reaches every replica. A new
revision of an installed model runs in engine cores of a new generation (a number in their
sockets' names): the supervisor makes the plan's next version, which names them
(service/processes/swaps.py), tells the old cores (``Retire``, whose pongs then tell the
front-ends, service/engine_core/protocol.py), answers with it a front-end that asks where a
model is (``Locate``: one started with an older plan, whose old cores stopped before it reached
them), and starts the front-ends it restarts from then on with it. Nothing of it is written
down: the supervisor's children die with it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
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
    version: int = 0  # one more each time a model moves to engine cores of a new revision
    # where the supervisor answers a front-end's ``Locate`` (ipc://...; "": nowhere)
    supervisor: str = ""

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
        """The plan with an ipc socket under ``run_dir`` for each replica of each model, and
        the supervisor's."""
        addresses = {
            model_id: self.generation_addresses(run_dir, index, 0)
            for index, model_id in enumerate(model_ids)
        }
        return replace(self, addresses=addresses, supervisor=f"ipc://{run_dir / 'plan.sock'}")

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

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ProcessPlan:
        return cls(**json.loads(text))


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
