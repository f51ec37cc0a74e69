"""The supervisor of the multi-process service (``python -m service``, ``MT_PROCESS_MODE=multi``).

It makes the process plan from the CPU budget (service/engine_core/plan.py), logs it, opens
the listening socket, starts each model's engine cores and then the HTTP front-ends (which
wait for the engine cores while they load), and watches them: a child that exits is started
again, at once where it had run a while, after a growing pause where it keeps dying at
start-up. The front-ends see an engine core that died as a closed connection and fail its
rows in flight with 503 + Retry-After; the restarted one is found again on its own.

SIGTERM (or Ctrl-C) drains, front-ends first: they stop admitting and finish their requests
in flight, for which the engine cores are still there; then the engine cores drain and stop.
The children run in a session of their own (a terminal's Ctrl-C reaches the supervisor alone,
which orders the drain), and each dies with the supervisor should it be killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from prometheus_client.multiprocess import mark_process_dead

from service.config import Settings
from service.cpus import cpu_budget
from service.engine_core.plan import ProcessPlan, plan_processes, runs_split
from service.translation.registry import ModelSpec, RegistryError, discover_models

logger = logging.getLogger(__name__)

POLL_S = 0.1
# A child that ran at least this long before it died is restarted at once; one that dies
# sooner waits 0.5 s, then twice as long at each death in a row, up to MAX_BACKOFF_S.
STEADY_S = 10.0
MAX_BACKOFF_S = 30.0
# beyond the drain's grace: the time a child may take to exit before it is killed
EXIT_SLACK_S = 5.0
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


@dataclass
class Supervisor:
    plan: ProcessPlan
    specs: list[ModelSpec]
    listener: socket.socket
    run_dir: Path
    env: dict[str, str]
    grace_s: float
    metrics_dir: Path | None = None  # PROMETHEUS_MULTIPROC_DIR of the children
    engines: list[Child] = field(default_factory=list)
    frontends: list[Child] = field(default_factory=list)
    _stopping: bool = False

    def __post_init__(self) -> None:
        python = [sys.executable, "-m"]
        plan_path = self.run_dir / "plan.json"
        self.plan.save(plan_path)
        for spec in self.specs:
            for replica, address in enumerate(self.plan.addresses[spec.model_id]):
                argv = [
                    *python,
                    "service.processes.engine_process",
                    "--model-id",
                    spec.model_id,
                    "--model-dir",
                    str(spec.model_dir),
                    "--address",
                    address,
                    "--threads",
                    str(self.plan.intra_op_threads),
                ]
                self.engines.append(Child(f"engine core {spec.model_id}/{replica}", argv))
        fd = self.listener.fileno()
        for index in range(self.plan.frontends):
            argv = [
                *python,
                "service.processes.frontend",
                "--fd",
                str(fd),
                "--plan",
                str(plan_path),
            ]
            self.frontends.append(Child(f"front-end {index}", argv, (fd,)))

    @property
    def children(self) -> list[Child]:
        return [*self.engines, *self.frontends]

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then drain; the exit status."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        try:
            for child in self.children:  # engine cores first: they take longest to be ready
                self._start(child)
            while not self._stopping:
                self._restart_dead()
                time.sleep(POLL_S)
            self._drain()
        finally:
            for child in self.children:
                if child.process is not None and child.process.poll() is None:
                    child.process.kill()
            self.listener.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.argv, env=self.env, pass_fds=child.pass_fds, start_new_session=True
        )
        child.started_at = time.monotonic()
        logger.info("started %s (pid %d)", child.name, child.process.pid)

    def _restart_dead(self) -> None:
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if process is None or process.poll() is None:
                if process is None and now >= child.start_after:
                    self._start(child)
                continue
            ran_s = now - child.started_at
            child.quick_deaths = 0 if ran_s >= STEADY_S else child.quick_deaths + 1
            pause_s = (
                min(MAX_BACKOFF_S, 0.5 * 2 ** (child.quick_deaths - 1)) if child.quick_deaths else 0
            )
            logger.error(
                "%s (pid %d) exited with %s after %.1f s; restarting it in %.1f s",
                child.name,
                process.pid,
                process.returncode,
                ran_s,
                pause_s,
            )
            if self.metrics_dir is not None:  # its gauges stop counting; counters stay
                mark_process_dead(process.pid, str(self.metrics_dir))
            child.process = None
            child.start_after = now + pause_s
            if not pause_s:
                self._start(child)

    def _drain(self) -> None:
        logger.info("draining: front-ends first, then engine cores (grace %.0f s)", self.grace_s)
        # one grace for both: the front-ends' requests in flight are the engine cores' rows
        deadline = time.monotonic() + self.grace_s + EXIT_SLACK_S
        for group in (self.frontends, self.engines):
            running = [
                c.process for c in group if c.process is not None and c.process.poll() is None
            ]
            for process in running:
                process.send_signal(signal.SIGTERM)
            for process in running:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.error("pid %d did not exit within the grace; killed", process.pid)
                    process.kill()
                    process.wait()


def listen(host: str, port: int) -> socket.socket:
    """The listening socket every front-end accepts on (inherited by each)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(2048)
    listener.set_inheritable(True)
    return listener


def uses_gpu(provider: str) -> bool:
    if provider == "cuda":
        return True
    if provider != "auto":
        return False
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def child_env(settings: Settings) -> dict[str, str]:
    """The children's environment: this one, with the settings the command line changed."""
    env = dict(os.environ)
    env.pop("MT_MODELS_DIR", None)
    env.update(
        MT_HOST=settings.process.host,
        MT_PORT=str(settings.process.port),
        MT_LOG_LEVEL=settings.process.log_level,
        MT_MODEL_DIR=str(settings.model.model_dir),
        MT_MODEL_DIRS=",".join(str(path) for path in settings.model.model_dirs),
    )
    if settings.model.models_dir is not None:
        env["MT_MODELS_DIR"] = str(settings.model.models_dir)
    return env


def build_supervisor(settings: Settings) -> Supervisor | None:
    """The supervisor for ``settings``; None where the plan is one process (``auto`` below
    four CPUs without a GPU) or no model can be served (the one-process service then starts, and its
    ``/health`` says why)."""
    try:
        model = settings.model
        specs = discover_models(
            model.model_dirs, model.models_dir, model.model_dir, model.model_name, model.load_only
        )
    except RegistryError as error:
        logger.error("%s", error)
        return None
    budget, gpu = cpu_budget(), uses_gpu(settings.model.provider)
    if not runs_split(settings.process.process_mode, budget, gpu):
        logger.info("process plan: one process (%s, MT_PROCESS_MODE=auto)", budget.describe())
        return None
    plan = plan_processes(
        budget,
        frontends=settings.process.frontends,
        engine_replicas=settings.process.engine_replicas,
        intra_op_threads=settings.model.intra_op_threads,
        gpu=gpu,
    )
    run_dir = Path(tempfile.mkdtemp(prefix="mtserve-"))
    plan = plan.with_addresses(run_dir, [spec.model_id for spec in specs])
    logger.info(
        "process plan: %s (%s); %d model(s)", plan.describe(), budget.describe(), len(specs)
    )
    listener = listen(settings.process.host, settings.process.port)
    env = child_env(settings)
    # every child writes its metrics here; /metrics on any front-end reads them all
    metrics_dir = run_dir / "metrics"
    metrics_dir.mkdir()
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return Supervisor(
        plan, specs, listener, run_dir, env, settings.process.shutdown_grace_s, metrics_dir
    )
