"""One engine core: a model's engine, warmed up (and calibrated where admission is
cost-aware), behind the continuous batcher that runs its step loop.

``build_engine_core`` is the one builder of it, for both process modes (vLLM's ``EngineCore``
behind ``InprocClient`` and ``MPClient``): the one-process service hands the batcher to the
translator itself (service/wiring.py); an engine-core process serves it on its socket
(service/processes/engine_process.py). Both build it here from the same settings, so the two
modes cannot disagree on the queue, the calibration or the encoder thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from service.cpus import spare_core
from service.engine_core.protocol import EngineCoreInfo
from service.metrics import ServiceMetrics
from service.runtime import heap
from service.runtime.engine import Engine
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.settings import BatchingSettings

Turn = Callable[[], AbstractContextManager[object]]

# Texts of MT_MAX_CHARS_PER_TEXT characters, each in its shortest sentences, that the queue
# holds where MT_MAX_QUEUE is unset: a few users pasting a page each at the same moment are
# served, not refused because the others' sentences still wait.
TEXTS_AT_ONCE = 4


@dataclass(frozen=True)
class EngineCore:
    """One model replica: its engine and the batcher in front of it (not yet started)."""

    model_id: str
    engine: Engine
    batcher: ContinuousBatcher

    @property
    def info(self) -> EngineCoreInfo:
        """What a front-end needs to know of it (the engine-core protocol's ``Pong``)."""
        return EngineCoreInfo(
            self.model_id,
            self.engine.provider,
            self.engine.model.info.max_positions,
            self.batcher.max_queue,
        )


def build_engine_core(
    model_id: str,
    engine: Engine,
    batching: BatchingSettings,
    metrics: ServiceMetrics,
    *,
    max_chars_per_text: int,
    cpus: int,
    turn: Turn = contextlib.nullcontext,
) -> EngineCore:
    """``engine`` warmed up, calibrated where admission is cost-aware, behind its batcher.

    ``batching``: the batching settings as they are; the queue is sized here from
    ``max_chars_per_text`` (``MT_MAX_CHARS_PER_TEXT``) where ``MT_MAX_QUEUE`` is unset, so
    ``TEXTS_AT_ONCE`` texts within the advertised limit are not refused by an idle engine
    core. ``metrics``: the
    model's (``ServiceMetrics.for_model``). ``cpus``: this core's share of the CPUs (the whole
    budget in one process, the plan's share per replica in an engine-core process), which
    decides whether the encoder thread gets a core of its own. ``turn``: several models on one
    device take turns (service/scheduling/turns.py)."""
    engine.warmup()
    batching = batching.queue_for(TEXTS_AT_ONCE * max_chars_per_text)
    if batching.admission_cost_aware and batching.batching == "continuous":
        engine.calibrate()
        # The calibration's largest calls left their memory in the sessions' arenas.
        engine.model.release_free_memory(engine.warmup)
    heap.trim()  # what loading and calibrating freed (service/runtime/heap.py)
    batcher = ContinuousBatcher(
        engine, batching, metrics=metrics, turn=turn, spare_core=spare_core(cpus)
    )
    return EngineCore(model_id, engine, batcher)
