"""The supervisor of the multi-process service (``python -m service``, ``MT_PROCESS_MODE=multi``).

It makes the process plan from the CPU budget (service/engine_core/plan.py), logs it, opens
the listening socket, starts each model's engine cores and then the HTTP front-ends (which
wait for the engine cores while they load), and watches them: a child that exits is started
again, at once where it had run a while, after a growing pause where it keeps dying at
start-up. The front-ends see an engine core that died as a closed connection and fail its
rows in flight with 503 + Retry-After; the restarted one is found again on its own. A new
revision of an installed model (``models update``) gets engine cores of its own, which replace
the old ones without a failed request (service/processes/swaps.py); a front-end that looks
for a model's cores asks the supervisor too where the plan has them now (``PlanDesk``,
service/engine_core/control.py), so one started with an older plan never waits on stopped ones.

SIGTERM (or Ctrl-C) drains, front-ends first: they stop admitting and finish their requests
in flight, for which the engine cores are still there; then the engine cores drain and stop.
The children run in a session of their own (a terminal's Ctrl-C reaches the supervisor alone,
which orders the drain), and each dies with the supervisor should it be killed.
"""

from __future__ import annotations

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

from service.config import ENV_PREFIX, RENAMED, Settings
from service.cpus import cpu_budget
from service.engine_core.control import PlanDesk
from service.engine_core.plan import ProcessPlan, plan_processes, runs_split
from service.processes.children import Child, frontend, frontend_plan
from service.processes.swaps import RevisionSwaps
from service.translation.discovery import RegistryError, discover_models
from service.translation.exports import ModelSpec

logger = logging.getLogger(__name__)

POLL_S = 0.1
# A child that ran at least this long before it died is restarted at once; one that dies
# sooner waits 0.5 s, then twice as long at each death in a row, up to MAX_BACKOFF_S.
STEADY_S = 10.0
MAX_BACKOFF_S = 30.0
# beyond the drain's grace: the time a child may take to exit before it is killed
EXIT_SLACK_S = 5.0


@dataclass
class Supervisor:
    plan: ProcessPlan
    specs: list[ModelSpec]
    listener: socket.socket
    run_dir: Path
    env: dict[str, str]
    grace_s: float
    metrics_dir: Path | None = None  # PROMETHEUS_MULTIPROC_DIR of the children
    reload_poll_s: float = 0.0  # how often the installed models' revisions are read (0: never)
    frontends: list[Child] = field(default_factory=list)
    _stopping: bool = False

    def __post_init__(self) -> None:
        self.swaps = RevisionSwaps(
            self.plan,
            self.run_dir,
            self.specs,
            self._start,
            self.reload_poll_s,
            self.grace_s,
            EXIT_SLACK_S,
            self._forget_metrics,
        )
        fd = self.listener.fileno()
        self.frontends = [frontend(index, fd, self.plan) for index in range(self.plan.frontends)]

    @property
    def engines(self) -> list[Child]:
        """The engine cores the current plan names."""
        return self.swaps.engines

    @property
    def children(self) -> list[Child]:
        return [*self.engines, *self.swaps.others, *self.frontends]

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then drain; the exit status."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        desk = PlanDesk(self.plan.supervisor)  # before any front-end may ask
        try:
            for child in self.children:  # engine cores first: they take longest to be ready
                self._start(child)
            while not self._stopping:
                self._restart_dead()
                self.swaps.tick()
                desk.answer(self.swaps.plan, wait_s=POLL_S)  # at once, between the turns
            self._drain()
        finally:
            desk.close()
            self.swaps.close()
            for child in self.children:
                if child.process is not None and child.process.poll() is None:
                    child.process.kill()
            self.listener.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _start(self, child: Child) -> None:
        if child in self.frontends:  # a front-end starts with the plan as it is now
            frontend_plan(child, self.swaps.plan)
        child.process = subprocess.Popen(
            child.argv, env=self.env, pass_fds=child.pass_fds, start_new_session=True
        )
        child.started_at = time.monotonic()
        logger.info("started %s (pid %d)", child.name, child.process.pid)

    def _restart_dead(self) -> None:
        now = time.monotonic()
        for child in [*self.engines, *self.frontends]:  # not those the swaps look after
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
            self._forget_metrics(process.pid)
            child.process = None
            child.start_after = now + pause_s
            if not pause_s:
                self._start(child)

    def _forget_metrics(self, pid: int) -> None:
        if self.metrics_dir is not None:  # its gauges stop counting; counters stay
            mark_process_dead(pid, str(self.metrics_dir))

    def _drain(self) -> None:
        logger.info("draining: front-ends first, then engine cores (grace %.0f s)", self.grace_s)
        # one grace for both: the front-ends' requests in flight are the engine cores' rows
        deadline = time.monotonic() + self.grace_s + EXIT_SLACK_S
        for group in (self.frontends, [*self.engines, *self.swaps.others]):
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


# Asked of a child interpreter: the supervisor runs no model, and ONNX Runtime (with numpy)
# would stay in its memory for its whole life (about 30 MB).
_CUDA_PROBE = (
    "import onnxruntime; print('CUDAExecutionProvider' in onnxruntime.get_available_providers())"
)


def uses_gpu(provider: str) -> bool:
    if provider == "cuda":
        return True
    if provider != "auto":
        return False
    probe = subprocess.run(
        [sys.executable, "-c", _CUDA_PROBE], capture_output=True, text=True, timeout=120
    )
    if probe.returncode == 0:
        return probe.stdout.strip() == "True"
    import onnxruntime  # the child failed: ask here, where an error says why

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def child_env(settings: Settings) -> dict[str, str]:
    """The children's environment: this one, with the settings the command line changed."""
    env = dict(os.environ)
    env.pop("MT_MODELS_DIR", None)
    for old_name in RENAMED:  # their values are in the new names below
        env.pop(f"{ENV_PREFIX}{old_name}", None)
    env.update(
        MT_HOST=settings.process.host,
        MT_PORT=str(settings.process.port),
        MT_LOG_LEVEL=settings.process.log_level,
        MT_EXPORTS=",".join(str(path) for path in settings.model.exports),
        MT_SERVED_MODEL_NAME=settings.model.served_model_name,
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
            model.exports, model.models_dir, model.served_model_name, model.load_only
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
    grace_s, poll_s = settings.process.shutdown_grace_s, settings.model.reload_poll_s
    return Supervisor(plan, specs, listener, run_dir, env, grace_s, metrics_dir, poll_s)
