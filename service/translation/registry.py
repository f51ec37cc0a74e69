"""The models one process serves (which ones: service/translation/discovery.py): loading
(the loader comes from service/wiring.py), lazy loading with an LRU bound, and leases that
keep a model loaded while requests use it (a model's slot: service/translation/slots.py).

Loading runs one model at a time in a worker thread (so loads do not fight for the cores
and the resident-memory growth measured around a load is that model's). Each loaded model
has its own engine, batcher thread and translator; with several models their engine threads
take round-robin turns (service/scheduling/turns.py).

With ``MT_MAX_LOADED_MODELS`` a load first unloads the least recently used model that no
request holds; when every loaded model is in use the bound is exceeded for a while and the
extra model is unloaded when its last request ends. ``MT_COLD_START`` decides whether the
first request for an unloaded model waits for the load or gets 503 + Retry-After.

A loaded model that is out of date (service/translation/revisions.py says when) is swapped:
the new one loads beside the old one, new requests lease it, and the old one stops once its
last request ends, so no request fails for the swap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from service.errors import ModelNotReady
from service.metrics import ServiceMetrics
from service.scheduling.turns import RoundRobinTurns
from service.translation.discovery import serving_pairs
from service.translation.exports import ModelSpec, installed_revision
from service.translation.model_settings import ModelSettings
from service.translation.revisions import RevisionWatch
from service.translation.slots import (
    Freshness,
    InstalledRevisions,
    LoadedModel,
    ModelLoader,
    ModelSlot,
    least_recently_used_idle,
    loaded_count,
    resident_bytes,
)
from service.translation.translator import Translator

logger = logging.getLogger(__name__)

RETIRE_POLL_S = 0.01  # how often a swapped-out model checks whether its last request ended


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
        ``revision_poll_s``: how often ``revisions`` looks for out-of-date models (0: never),
        as ``freshness`` says (None: ``InstalledRevisions``)."""
        self.config = config
        self.shutdown_grace_s = shutdown_grace_s
        self.turns = turns
        self.metrics = metrics
        self._load_model = load_model
        self.slots = {spec.model_id: ModelSlot(spec, config.provider) for spec in specs}
        self.revisions = RevisionWatch(
            self.slots, self.reload, freshness or InstalledRevisions(), revision_poll_s
        )
        self.by_pair = serving_pairs(specs)
        self._load_lock = asyncio.Lock()
        self._accepting = True
        self._background: set[asyncio.Task[None]] = set()

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
        self.revisions.stop()
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
            slot.provider = model.info.provider
            slot.memory_bytes = after - before if before is not None and after is not None else None
            slot.last_used = time.monotonic()
            slot.state = "loaded"
            self.metrics.model_loads.labels(model=spec.model_id, outcome="loaded").inc()
            self.metrics.models_loaded.set(self.loaded_count())
            logger.info("model %s (%s→%s) loaded on %s", spec.model_id, *spec.pair, slot.provider)

    def loaded_count(self) -> int:
        return loaded_count(self.slots.values())

    def _over_bound(self) -> bool:
        bound = self.config.max_loaded_models
        return bool(bound) and self.loaded_count() > bound

    def _idle_lru(self) -> ModelSlot | None:
        return least_recently_used_idle(self.slots.values())

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

    # --- a new revision, swapped in (when: service/translation/revisions.py) -------------

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
            slot.model, slot.revision, slot.provider = new, revision, new.info.provider
        logger.info("model %s: revision %s serves; the old one drains", model_id, revision)
        deadline = time.monotonic() + self.shutdown_grace_s
        while old.leases and time.monotonic() < deadline:
            await asyncio.sleep(RETIRE_POLL_S)
        await old.batcher.shutdown(self.shutdown_grace_s)
        return True
