"""A model as the registry holds it: its slot (spec, state, what loading it cost), the parts
a load builds together (``LoadedModel``) and what says a loaded model is out of date
(``Freshness``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from service.engine_core.protocol import EngineCoreInfo
from service.scheduling.row_batcher import RowBatcher
from service.translation.exports import ModelSpec, installed_revision, onnx_bytes
from service.translation.translator import Translator

ModelState = Literal["unloaded", "loading", "loaded", "failed"]


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux), None where unknown."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(eq=False)
class LoadedModel:
    """A loaded model's parts, built together (service/wiring.py) and dropped together."""

    info: EngineCoreInfo  # its engine core's, in this process or at ``core_addresses``
    batcher: RowBatcher
    translator: Translator
    leases: int = 0  # requests holding it: a model swapped out stops after the last one
    core_addresses: tuple[str, ...] = ()  # where engine cores run it: their sockets


# Builds a model from its spec: engine warmed up, batcher built but not started. Runs in a
# worker thread.
ModelLoader = Callable[[ModelSpec], LoadedModel]


class ModelSlot:
    """One model: its spec, state, and when loaded its engine, batcher and translator."""

    def __init__(self, spec: ModelSpec, provider: str) -> None:
        self.spec = spec
        self.state: ModelState = "unloaded"
        self.detail: str | None = None
        self.provider = provider  # the setting until loaded, then what the engine uses
        self.model: LoadedModel | None = None
        self.revision: str | None = None  # manifest.json's, when loaded (installed models)
        self.weights_bytes = onnx_bytes(spec.model_dir)
        self.memory_bytes: int | None = None  # resident growth while it loaded
        self.last_used = 0.0
        self.leases = 0
        self.loading: asyncio.Task[None] | None = None


class Freshness(Protocol):
    """What the registry's watch asks (every ``revision_poll_s``, or woken): which loaded
    models to swap."""

    def outdated(self, slot: ModelSlot) -> bool: ...


class InstalledRevisions(Freshness):
    """One process: a model is out of date once its installed revision moved."""

    def outdated(self, slot: ModelSlot) -> bool:
        # None: no manifest, or an install renaming the old directory aside just now
        return installed_revision(slot.spec.model_dir) not in (None, slot.revision)


def loaded_count(slots: Iterable[ModelSlot]) -> int:
    return sum(slot.state == "loaded" for slot in slots)


def least_recently_used_idle(slots: Iterable[ModelSlot]) -> ModelSlot | None:
    """The loaded model no request holds that was used longest ago: the one a bound on the
    loaded models unloads first."""
    idle = [slot for slot in slots if slot.state == "loaded" and slot.leases == 0]
    return min(idle, key=lambda slot: slot.last_used, default=None)
