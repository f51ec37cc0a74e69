"""New revisions of installed models in the multi-process service: the supervisor's side of
the swap that ``python -m service models update`` asks for.

Every ``MT_RELOAD_POLL_S`` the supervisor reads each model's installed revision. Where it
moved, engine cores of the new revision start beside the old ones, at new sockets (the
generation's number is in their names): twice the model's memory for a while. Once each of them
answers the supervisor's ping (``CoreControl``, service/engine_core/control.py), the next
version of the plan names them and the old ones get ``Retire``. Their pongs tell each
front-end within a ping (service/translation/plan_follower.py): its new requests go to the new
engine cores, the requests holding the old ones finish there, and then it detaches from them.
An old engine core with no front-end holding it any more (each detached, or was killed: silent)
says ``Free``, and drains and stops, so none is sent a row after it stopped accepting; one that
never says so (a front-end hangs holding it) stops at most ``RETIRE_WAIT_S`` beyond the drain's
grace. Front-ends restarted from then on get the new plan on their command line; one started
with the old plan that finds the old cores already stopped asks the supervisor where the model
is (``PlanDesk``, service/engine_core/control.py), answered from this plan.

A new engine core that exits before it is ready fails the swap: the old ones serve on, the log
says so, and that revision is not tried again until it changes. An old engine core that dies
before the plan moves is restarted as any other (it loads what the model's directory holds);
one that dies after is not, as the front-ends are moving away from it.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.engine_core.control import CoreControl
from service.engine_core.plan import ProcessPlan
from service.processes.children import Child, engine_cores
from service.translation.exports import ModelSpec, installed_revision

logger = logging.getLogger(__name__)

# The backstop: how long old engine cores may wait for their ``Free`` beyond the front-ends'
# own wait for their requests on them (the drain's grace). A core says it within a few seconds
# of the last front-end's move (a tokenizer's load, the silence of a killed front-end).
RETIRE_WAIT_S = 60.0
# How long new engine cores may take to be ready before the swap is given up.
LOAD_WAIT_S = 600.0


@dataclass(eq=False)
class Generation:
    """One model's engine cores of one revision."""

    spec: ModelSpec
    number: int
    revision: str | None
    addresses: list[str]
    children: list[Child]
    started_at: float = 0.0
    control: CoreControl | None = None  # the supervisor's sockets to its cores, until stopped
    retired_in: int = 0  # the plan version that moved the model away from it
    stop_by: float = 0.0  # retiring: stopped then even without every core's Free
    kill_at: float | None = None  # stopping: killed then if still running

    @property
    def running(self) -> list[Child]:
        return [child for child in self.children if child.running]

    def signal(self, signum: int) -> None:
        for child in self.running:
            assert child.process is not None
            child.process.send_signal(signum)

    @property
    def free(self) -> bool:
        """Every core still running said ``Free`` (children and addresses pair by index)."""
        freed = self.control.freed if self.control is not None else set()
        pairs = zip(self.children, self.addresses, strict=True)
        return all(address in freed for child, address in pairs if child.running)

    def close(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None


@dataclass(eq=False)
class RevisionSwaps:
    """Each model's engine cores by generation: the current ones (which the supervisor keeps
    running), those loading a new revision, and those retiring."""

    plan: ProcessPlan
    run_dir: Path
    specs: list[ModelSpec]
    start: Callable[[Child], None]  # the supervisor's: starts a child's process
    poll_s: float  # MT_RELOAD_POLL_S; 0: never
    grace_s: float
    exit_slack_s: float
    on_exit: Callable[[int], None] = lambda pid: None  # an engine core's process ended
    current: dict[str, Generation] = field(default_factory=dict)
    loading: dict[str, Generation] = field(default_factory=dict)
    retiring: list[Generation] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # model id -> revision that failed
    _looked_at: float = 0.0

    def __post_init__(self) -> None:
        for spec in self.specs:
            addresses = self.plan.addresses[spec.model_id]
            children = engine_cores(spec, addresses, self.plan, "")
            revision = installed_revision(spec.model_dir)
            control = CoreControl(addresses)
            generation = Generation(spec, 0, revision, addresses, children, control=control)
            self.current[spec.model_id] = generation

    @property
    def engines(self) -> list[Child]:
        """The engine cores the plan names (restarted when they die)."""
        return [child for generation in self.current.values() for child in generation.children]

    @property
    def others(self) -> list[Child]:
        """The engine cores loading a new revision or retiring."""
        generations = [*self.loading.values(), *self.retiring]
        return [child for generation in generations for child in generation.children]

    def tick(self) -> None:
        """One turn of the supervisor's loop."""
        now = time.monotonic()
        if self.poll_s > 0 and now - self._looked_at >= self.poll_s:
            self._looked_at = now
            self._look_for_revisions(now)
        for model_id, generation in list(self.loading.items()):
            self._follow_load(model_id, generation, now)
        for generation in list(self.retiring):
            self._retire(generation, now)

    def close(self) -> None:
        for generation in [*self.current.values(), *self.loading.values(), *self.retiring]:
            generation.close()

    # --- loading a new revision -------------------------------------------------------------

    def _look_for_revisions(self, now: float) -> None:
        for index, spec in enumerate(self.specs):
            model_id = spec.model_id
            revision = installed_revision(spec.model_dir)
            # None: no manifest, or an install renaming the old directory aside just now
            if revision is None or model_id in self.loading:
                continue
            if revision in (self.current[model_id].revision, self.failed.get(model_id)):
                continue
            number = max(g.number for g in self._generations(model_id)) + 1
            addresses = self.plan.generation_addresses(self.run_dir, index, number)
            children = engine_cores(spec, addresses, self.plan, f" g{number}")
            control = CoreControl(addresses)
            generation = Generation(spec, number, revision, addresses, children, now, control)
            logger.info(
                "model %s: revision %s is installed; loading it in %d engine core(s) beside "
                "revision %s",
                model_id,
                revision,
                len(children),
                self.current[model_id].revision,
            )
            for child in children:
                self.start(child)
            self.loading[model_id] = generation

    def _generations(self, model_id: str) -> list[Generation]:
        retiring = [g for g in self.retiring if g.spec.model_id == model_id]
        return [self.current[model_id], *retiring]

    def _follow_load(self, model_id: str, generation: Generation, now: float) -> None:
        assert generation.control is not None
        generation.control.poll()
        exited = [child for child in generation.children if not child.running]
        if exited or now - generation.started_at > LOAD_WAIT_S:
            why = (
                f"{exited[0].name} exited with {exited[0].process.returncode}"
                if exited and exited[0].process is not None
                else f"not ready within {LOAD_WAIT_S:.0f} s"
            )
            logger.error(
                "model %s: loading revision %s failed (%s; see its log above); revision %s "
                "serves on",
                model_id,
                generation.revision,
                why,
                self.current[model_id].revision,
            )
            self._give_up(model_id, generation)
        elif generation.control.ready:
            self._publish(model_id, generation, now)

    def _give_up(self, model_id: str, generation: Generation) -> None:
        assert generation.revision is not None
        generation.close()
        del self.loading[model_id]
        self.failed[model_id] = generation.revision
        generation.signal(signal.SIGKILL)  # it serves nothing yet
        for child in generation.children:
            if child.process is not None:
                child.process.wait()
                self.on_exit(child.process.pid)

    def _publish(self, model_id: str, generation: Generation, now: float) -> None:
        del self.loading[model_id]
        self.plan = self.plan.moved(model_id, generation.addresses)
        old = self.current[model_id]
        old.retired_in = self.plan.version
        old.stop_by = now + self.grace_s + RETIRE_WAIT_S
        assert old.control is not None
        old.control.retire(generation.addresses, self.plan.version)
        self.retiring.append(old)
        self.current[model_id] = generation
        logger.info(
            "model %s: revision %s serves (plan version %d); revision %s retires once every "
            "front-end has moved off it",
            model_id,
            generation.revision,
            self.plan.version,
            old.revision,
        )

    # --- retiring the old engine cores ------------------------------------------------------

    def _retire(self, generation: Generation, now: float) -> None:
        if generation.kill_at is None:
            if generation.control is not None:
                generation.control.poll()
            free = generation.free
            if not free and now < generation.stop_by:
                return
            if not free:
                logger.warning(
                    "a front-end still holds an engine core of %s's revision %s %.0f s after "
                    "plan version %d moved the model; stopping them anyway",
                    generation.spec.model_id,
                    generation.revision,
                    self.grace_s + RETIRE_WAIT_S,
                    generation.retired_in,
                )
            # they drain: rows still in flight finish within the grace
            generation.signal(signal.SIGTERM)
            generation.kill_at = now + self.grace_s + self.exit_slack_s
            return
        if now >= generation.kill_at:
            logger.error(
                "the engine cores of %s's revision %s did not exit within the grace; killed",
                generation.spec.model_id,
                generation.revision,
            )
            generation.signal(signal.SIGKILL)
        if generation.running:
            return
        for child in generation.children:
            if child.process is not None:
                child.process.wait()
                self.on_exit(child.process.pid)
        generation.close()
        self.retiring.remove(generation)
        logger.info(
            "model %s: the engine cores of revision %s stopped",
            generation.spec.model_id,
            generation.revision,
        )
