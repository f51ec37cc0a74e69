"""The models one process serves: discovery from the configured directories, loading (the
loader comes from service/wiring.py), lazy loading with an LRU bound, and leases that keep a
model loaded while requests use it.

Discovery reads only each export's ``config.json`` (its ``source_lang`` / ``target_lang``;
exports from before the field existed fall back to the tokenizer's config): nothing is
loaded at start-up that is not served, and two models for one pair are refused at start-up
rather than one silently shadowing the other.

A multilingual export (M2M-100, NLLB-200) declares a set of ``languages`` instead and serves
every pair of them; a model of one pair still wins that pair, and where two multilingual
models share a pair the one configured first serves it.

Loading runs one model at a time in a worker thread (so loads do not fight for the cores
and the resident-memory growth measured around a load is that model's). Each loaded model
has its own engine, batcher thread and translator; with several models their engine threads
take round-robin turns (service/scheduling/turns.py).

With ``MT_MAX_LOADED_MODELS`` a load first unloads the least recently used model that no
request holds; when every loaded model is in use the bound is exceeded for a while and the
extra model is unloaded when its last request ends. ``MT_COLD_START`` decides whether the
first request for an unloaded model waits for the load or gets 503 + Retry-After.

A loaded model that is out of date is swapped (``MT_RELOAD_POLL_S``): the new one loads beside
the old one, new requests lease it, and the old one stops once its last request ends, so no
request fails for the swap. Out of date (``Freshness``): in one process, a new revision that
``python -m service models update`` renamed into its directory (loaded a second time beside
the old); in a front-end, new engine cores the supervisor's plan names (plan_follower.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from service.engine_core.protocol import EngineCoreInfo
from service.errors import ModelNotReady
from service.metrics import ServiceMetrics
from service.runtime.engine import Engine
from service.scheduling.row_batcher import RowBatcher
from service.scheduling.turns import RoundRobinTurns
from service.translation.exports import ModelSpec, installed_revision, model_spec, onnx_bytes
from service.translation.languages import normalise_language_code
from service.translation.model_settings import DEFAULT_EXPORT, ModelSettings
from service.translation.translator import Translator

logger = logging.getLogger(__name__)

ModelState = Literal["unloaded", "loading", "loaded", "failed"]
RETIRE_POLL_S = 0.01  # how often a swapped-out model checks whether its last request ended


class RegistryError(Exception):
    """The configured models cannot be served (none found, or two for one pair)."""


def discover_models(
    exports: Sequence[Path],
    models_dir: Path | None,
    served_model_name: str = "",
    load_only: Sequence[str] = (),
) -> list[ModelSpec]:
    """The models the settings name: ``exports`` and the sub-directories of ``models_dir``
    that hold a ``config.json`` (an installed model replaces an export of its pair, as a
    pulled model replaces a shipped one); the default export when both are empty. A model
    served alone is named ``served_model_name`` if given. ``load_only``: only the models of
    those languages."""
    installed: list[Path] = []
    if models_dir is not None:
        root = Path(models_dir)
        if not root.is_dir():
            raise RegistryError(f"MT_MODELS_DIR={root} is not a directory")
        # Hidden entries are pulls in progress (service/models_cli/store.py).
        installed = sorted(
            sub
            for sub in root.iterdir()
            if not sub.name.startswith(".") and (sub / "config.json").is_file()
        )
    if not exports and not installed:
        exports = [DEFAULT_EXPORT]
    alone = len(exports) == 1 and not installed
    given = [model_spec(Path(path), served_model_name if alone else "") for path in exports]
    pulled = [model_spec(directory, "") for directory in installed]
    replaced = {spec.pair for spec in pulled if not spec.multilingual}
    for spec in given:
        if not spec.multilingual and spec.pair in replaced:
            logger.info("%s→%s: serving the installed model, not %s", *spec.pair, spec.model_dir)
    specs = [s for s in given if s.multilingual or s.pair not in replaced] + pulled
    for kind, key in (("name", lambda s: s.model_id), ("language pair", lambda s: s.pair)):
        seen: dict[object, ModelSpec] = {}
        for spec in specs:
            if kind == "language pair" and spec.multilingual:
                continue  # overlapping multilingual models are resolved in serving_pairs
            if (other := seen.setdefault(key(spec), spec)) is not spec:
                raise RegistryError(
                    f"two models with the {kind} {key(spec)}: {other.model_dir} and "
                    f"{spec.model_dir}"
                )
    if not specs:
        raise RegistryError("no models configured")
    return only_languages(specs, load_only) if load_only else specs


def only_languages(specs: Sequence[ModelSpec], languages: Sequence[str]) -> list[ModelSpec]:
    """The models that serve only ``languages`` (MT_LOAD_ONLY): a model of one pair when
    both of its languages are listed, a multilingual model cut down to the listed ones."""
    wanted = {normalise_language_code(code) for code in languages}
    kept = []
    for spec in specs:
        if spec.multilingual:
            codes = tuple(code for code in spec.languages if code in wanted)
            if len(codes) >= 2:
                kept.append(
                    replace(spec, source_lang=codes[0], target_lang=codes[1], languages=codes)
                )
        elif {normalise_language_code(code) for code in spec.pair} <= wanted:
            kept.append(spec)
    if not kept:
        served = sorted({code for spec in specs for pair in spec.pairs() for code in pair})
        raise RegistryError(
            f"MT_LOAD_ONLY={','.join(languages)} leaves no model to serve; the configured "
            f"models serve {', '.join(served)}"
        )
    return kept


def serving_pairs(specs: Sequence[ModelSpec]) -> dict[tuple[str, str], str]:
    """(source, target) -> the model id that serves it: models of one pair first, then each
    multilingual model, in the configured order, for the pairs still free."""
    by_pair = {spec.pair: spec.model_id for spec in specs if not spec.multilingual}
    for spec in specs:
        if spec.multilingual:
            for pair in spec.pairs():
                by_pair.setdefault(pair, spec.model_id)
    return by_pair


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

    engine: Engine | EngineCoreInfo  # the info alone where engine cores run it
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
    """What the registry's watch asks every ``revision_poll_s``: which loaded models to swap."""

    def refresh(self) -> None:  # read again what ``outdated`` answers from
        return None

    def outdated(self, slot: ModelSlot) -> bool: ...

    def settled(self) -> None:  # no loaded model is out of date, the swapped-out ones stopped
        return None


class InstalledRevisions(Freshness):
    """One process: a model is out of date once its installed revision moved."""

    def outdated(self, slot: ModelSlot) -> bool:
        # None: no manifest, or an install renaming the old directory aside just now
        return installed_revision(slot.spec.model_dir) not in (None, slot.revision)


class ModelRegistry:
    def __init__(
        self,
        specs: Sequence[ModelSpec],
        config: ModelSettings,
        metrics: ServiceMetrics,
        load_model: ModelLoader,
        turns: RoundRobinTurns | None = None,
        shutdown_grace_s: float = 30.0,
        revision_poll_s: float = 0.0,
        freshness: Freshness | None = None,
    ) -> None:
        """``config``: the model settings (a model reports their provider until it is
        loaded); ``turns``: the step-by-step turns the models' engine threads take on one
        device (None: they run at once), the loader hands each batcher its turn;
        ``shutdown_grace_s``: how long an unloaded model's in-flight work may finish;
        ``revision_poll_s``: how often :meth:`watch_revisions` looks for out-of-date models
        (0: never), as ``freshness`` says (None: ``InstalledRevisions``)."""
        self.config = config
        self.shutdown_grace_s = shutdown_grace_s
        self.revision_poll_s = revision_poll_s
        self.freshness = freshness if freshness is not None else InstalledRevisions()
        self.turns = turns
        self.metrics = metrics
        self._load_model = load_model
        self.slots = {spec.model_id: ModelSlot(spec, config.provider) for spec in specs}
        self.by_pair = serving_pairs(specs)
        self._load_lock = asyncio.Lock()
        self._accepting = True
        self._background: set[asyncio.Task[None]] = set()
        self._watching: asyncio.Task[None] | None = None

    # --- start-up and shutdown -----------------------------------------------------------

    def eager(self) -> list[ModelSlot]:
        """Models loaded at start-up: all, unless MT_LAZY_LOAD, at most MT_MAX_LOADED_MODELS."""
        if self.config.lazy_load:
            return []
        bound = self.config.max_loaded_models or len(self.slots)
        return list(self.slots.values())[:bound]

    async def load_eager(self) -> list[ModelSlot]:
        """Load the start-up models one after another; returns those that failed."""
        for slot in self.eager():
            await self._ensure_loading(slot)
            assert slot.loading is not None
            await slot.loading
        return [slot for slot in self.eager() if slot.state == "failed"]

    def begin_shutdown(self) -> None:
        self._accepting = False
        if self._watching is not None:
            self._watching.cancel()
        for slot in self.slots.values():
            if slot.model is not None:
                slot.model.batcher.begin_shutdown()

    async def shutdown(self, grace_s: float) -> bool:
        """Drain every loaded model within ``grace_s``; whether all drained."""
        self.begin_shutdown()
        batchers = [slot.model.batcher for slot in self.slots.values() if slot.model is not None]
        drained = await asyncio.gather(*(batcher.shutdown(grace_s) for batcher in batchers))
        return all(drained)

    # --- requests ------------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, model_ids: Sequence[str]) -> AsyncIterator[list[Translator]]:
        """The translators of ``model_ids``, loaded (or ``ModelNotReady``) and kept loaded
        until the block ends."""
        slots = [self.slots[model_id] for model_id in model_ids]
        pinned: list[tuple[ModelSlot, LoadedModel]] = []
        try:
            translators = []
            for slot in slots:
                await self._ready(slot)
                # No await since the readiness check: nothing unloaded it meanwhile. Pinned
                # from here, so loading the next model (a pivot's second leg) cannot evict it.
                if slot.state != "loaded" or slot.model is None:
                    raise ModelNotReady(slot.spec.model_id, slot.state, self._why(slot))
                slot.leases += 1
                slot.model.leases += 1
                slot.last_used = time.monotonic()
                pinned.append((slot, slot.model))
                translators.append(slot.model.translator)
            yield translators
        finally:
            for slot, model in pinned:
                slot.leases -= 1
                model.leases -= 1
                slot.last_used = time.monotonic()
            if self._over_bound() and self._accepting:
                trim = asyncio.get_running_loop().create_task(self._trim())
                self._background.add(trim)  # a task nobody holds may be collected mid-run
                trim.add_done_callback(self._background.discard)

    async def _ready(self, slot: ModelSlot) -> None:
        if slot.state == "loaded":
            return
        if slot.state == "failed":
            raise ModelNotReady(slot.spec.model_id, slot.state, self._why(slot))
        await self._ensure_loading(slot)
        assert slot.loading is not None
        if self.config.cold_start == "reject":
            raise ModelNotReady(slot.spec.model_id, "loading", self._why(slot))
        await asyncio.shield(slot.loading)
        if slot.state != "loaded":
            raise ModelNotReady(slot.spec.model_id, slot.state, self._why(slot))

    @staticmethod
    def _why(slot: ModelSlot) -> str:
        spec = slot.spec
        languages = f"{len(spec.languages)} languages" if spec.multilingual else "→".join(spec.pair)
        model = f"model {spec.model_id} ({languages})"
        if slot.state == "failed":
            return f"{model} failed to load: {slot.detail}"
        return f"{model} is loading; retry shortly"

    # --- loading and unloading -----------------------------------------------------------

    async def _ensure_loading(self, slot: ModelSlot) -> None:
        if slot.state in ("loaded", "failed"):
            return
        if slot.loading is None or slot.loading.done():
            slot.state = "loading"
            slot.loading = asyncio.get_running_loop().create_task(self._load(slot))

    async def _load(self, slot: ModelSlot) -> None:
        spec = slot.spec
        async with self._load_lock:
            if slot.state == "loaded":
                return
            await self._make_room()
            slot.revision = installed_revision(spec.model_dir)  # read before: a swap reloads
            before = resident_bytes()
            try:
                model = await asyncio.to_thread(self._load_model, spec)
            except Exception as error:
                logger.exception("loading model %s from %s failed", spec.model_id, spec.model_dir)
                # The detail reaches responses: the exception's type, not its text (paths).
                slot.state, slot.detail = "failed", f"{type(error).__name__}; see the server log"
                self.metrics.model_loads.labels(model=spec.model_id, outcome="failed").inc()
                return
            after = resident_bytes()
            if not self._accepting:  # shut down while it loaded: start no engine thread
                slot.state = "unloaded"
                return
            model.batcher.start()
            slot.model = model
            slot.provider = model.engine.provider
            slot.memory_bytes = after - before if before is not None and after is not None else None
            slot.last_used = time.monotonic()
            slot.state = "loaded"
            self.metrics.model_loads.labels(model=spec.model_id, outcome="loaded").inc()
            self.metrics.models_loaded.set(self.loaded_count())
            logger.info("model %s (%s→%s) loaded on %s", spec.model_id, *spec.pair, slot.provider)

    def loaded_count(self) -> int:
        return sum(slot.state == "loaded" for slot in self.slots.values())

    def _over_bound(self) -> bool:
        bound = self.config.max_loaded_models
        return bool(bound) and self.loaded_count() > bound

    def _idle_lru(self) -> ModelSlot | None:
        idle = [s for s in self.slots.values() if s.state == "loaded" and s.leases == 0]
        return min(idle, key=lambda slot: slot.last_used, default=None)

    async def _make_room(self) -> None:
        """Before a load (holding the load lock): unload idle LRU models down to the bound."""
        bound = self.config.max_loaded_models
        while bound and self.loaded_count() >= bound and (victim := self._idle_lru()):
            await self._unload(victim)

    async def _trim(self) -> None:
        async with self._load_lock:
            while self._over_bound() and (victim := self._idle_lru()):
                await self._unload(victim)

    async def _unload(self, slot: ModelSlot) -> None:
        logger.info("unloading model %s (least recently used)", slot.spec.model_id)
        model = slot.model
        slot.state = "unloaded"
        slot.model = None
        slot.memory_bytes = None
        slot.provider = self.config.provider
        self.metrics.model_evictions.inc()
        self.metrics.models_loaded.set(self.loaded_count())
        if model is not None:  # no lease holds it: this only stops its thread
            await model.batcher.shutdown(self.shutdown_grace_s)
        self.metrics.forget_model(slot.spec.model_id)

    # --- new revisions of installed models -----------------------------------------------

    def watch_revisions(self) -> None:
        """From now on, every ``revision_poll_s``, reload the loaded models that are out of
        date (a new revision, ``python -m service models update``); until shutdown."""
        if self.revision_poll_s > 0 and self._watching is None and self._accepting:
            self._watching = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.revision_poll_s)
            await self.catch_up()

    async def catch_up(self) -> None:
        """Reload the loaded models that are out of date; say so once none is."""
        fresh = self.freshness
        fresh.refresh()
        for model_id, slot in list(self.slots.items()):
            if slot.state == "loaded" and fresh.outdated(slot):
                await self.reload(model_id)
        pending = [s for s in self.slots.values() if s.state in ("loading", "loaded")]
        if not any(s.state == "loading" or fresh.outdated(s) for s in pending):
            fresh.settled()

    async def reload(self, model_id: str) -> bool:
        """Load ``model_id`` again from its directory and swap it in: requests from then on
        use the new one, those holding the old one finish on it, and the old batcher stops
        after the last of them, so no request fails for the swap. False where the model is
        not loaded or the new one failed to load (the old one serves on: a revision that
        fails is not tried again until it changes)."""
        slot = self.slots[model_id]
        async with self._load_lock:
            old = slot.model
            if slot.state != "loaded" or old is None or not self._accepting:
                return False
            revision = installed_revision(slot.spec.model_dir)
            try:
                new = await asyncio.to_thread(self._load_model, slot.spec)
            except Exception:
                logger.exception("reloading model %s failed; the loaded one serves on", model_id)
                slot.revision = revision
                return False
            if not self._accepting:  # shut down while it loaded: the old one drains
                return False
            new.batcher.start()
            slot.model, slot.revision, slot.provider = new, revision, new.engine.provider
        logger.info("model %s: revision %s serves; the old one drains", model_id, revision)
        deadline = time.monotonic() + self.shutdown_grace_s
        while old.leases and time.monotonic() < deadline:
            await asyncio.sleep(RETIRE_POLL_S)
        await old.batcher.shutdown(self.shutdown_grace_s)
        return True
