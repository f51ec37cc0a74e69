"""The service's life: load and warm the models in the background (and the language
detector), refuse new work from SIGTERM on and drain in-flight work within the grace.

``ServiceState`` lives on ``app.state.service``: phase, the model registry and the
dispatcher, the stores, the things routes need. ``/health`` answers at once; ``/ready`` says
503 until the start-up models are loaded and warmed up (with ``MT_LAZY_LOAD``, until the
detector is), and while the shared database (``MT_DATABASE_URL``) cannot be reached: a
balancer then sends the requests to a replica that can serve them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace

from fastapi import FastAPI

from service.config import Settings
from service.metrics import ServiceMetrics
from service.storage.databases import Databases, open_databases
from service.storage.documents import DocumentJob, DocumentStore
from service.storage.glossaries import GlossaryStore
from service.storage.memories import MemoryChoice, MemoryStore
from service.storage.sqlite import store_problem
from service.text.bulk import TranslateTexts
from service.translation.dispatch import Dispatcher, document_translator
from service.translation.document_jobs import DocumentRunner
from service.translation.languages import LanguagePair
from service.translation.registry import ModelRegistry
from service.web.errors import ApiError, ErrorInfo, describe_error
from service.web.frozen_heap import keep_frozen
from service.web.quota import CharacterQuota

logger = logging.getLogger(__name__)


class ServiceState:
    """What the routes need: phase, the models, the dispatcher."""

    def __init__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        registry: ModelRegistry | None,
        build_dispatcher: Callable[[], Dispatcher] | None,
        failure: str | None = None,
        databases: Databases | None = None,
        glossaries: GlossaryStore | None = None,
        memories: MemoryStore | None = None,
    ) -> None:
        """``registry`` and ``build_dispatcher`` come from service/wiring.py; ``failure``:
        why there are none (the configured models cannot be served); ``databases``: where
        the stores keep their rows (opened from the settings when not given);
        ``glossaries`` and ``memories``: the stored glossaries and translation memories
        (in ``databases`` when not given)."""
        self.settings = settings
        self.metrics = metrics
        self.limits = settings.limits  # per-request limits and decoding defaults
        # loading → ready → shutting_down; or failed, or store_unwritable (MT_DATA_DIR)
        self.phase = "failed" if failure else "loading"
        self.detail: str | None = failure
        self.registry = registry
        storage = settings.storage
        local_store = not storage.database_url  # else the shared database holds the state
        if failure is None and local_store and (problem := store_problem(storage.data_dir)):
            logger.error("%s; mount a writable volume there or point MT_DATA_DIR at one", problem)
            self.phase, self.detail = "store_unwritable", problem  # /ready says 503 and why
        self.databases = databases or open_databases(storage.data_dir, storage.database_url)
        main = self.databases.main
        self.glossaries = glossaries or GlossaryStore(main, settings.access.max_glossary_entries)
        self.memories = memories or MemoryStore(main, settings.limits.max_chars_per_text)
        self.documents = DocumentStore(self.databases.documents, storage.document_ttl_s)
        metrics.watch_documents(self.documents.counts)
        self.document_runner = DocumentRunner(
            self.documents,
            self._document_translator,
            storage.document_jobs,
            lease_s=storage.document_lease_s,
        )
        self._build_dispatcher = build_dispatcher
        # DeepL's /v2/usage and MT_DEEPL_CHARACTER_LIMIT, in the same database.
        self.quota = CharacterQuota(main, settings.access.deepl_character_limit)
        self.dispatcher: Dispatcher | None = None
        # Set by the first begin_shutdown: the grace counts from SIGTERM, not from when the
        # server gets round to the lifespan shutdown.
        self.shutdown_deadline: float | None = None
        # Whether the heap is frozen out of full collections once ready (service/web/frozen_heap.py):
        # the server sets it (a process of its own); an app in a test leaves it off.
        self.freeze_heap = False
        self._frozen: asyncio.Task[None] | None = None

    async def load(self) -> None:
        """Load the detector and the start-up models, then say ready."""
        if self.registry is None or self._build_dispatcher is None:
            return
        registry = self.registry
        try:
            self.dispatcher = await asyncio.to_thread(self._build_dispatcher)
        except Exception as error:
            logger.exception("loading the language detector failed")
            # The detail goes into responses: the exception's type only, never its text
            # (paths, library internals); the log has the rest.
            self.phase = "failed"
            self.detail = (
                f"loading the language detector failed ({type(error).__name__}); see the server log"
            )
            return
        if failed := await registry.load_eager():
            self.phase = "failed"
            self.detail = "; ".join(
                f"loading the model {slot.spec.model_id} failed: {slot.detail}" for slot in failed
            )
            return
        if self.phase == "loading":
            self.phase = "ready"
            logger.info("ready: %d models, %d loaded", len(registry.slots), registry.loaded_count())
            registry.revisions.watch()  # new revisions of installed models (models update)
            if self.freeze_heap:
                self._frozen = asyncio.create_task(keep_frozen(self._loaded_models))

    def _loaded_models(self) -> tuple[int, ...]:
        """Which model objects are loaded (a swap for a new revision is another object)."""
        assert self.registry is not None
        return tuple(id(slot.model) for slot in self.registry.slots.values())

    def _document_translator(self, job: DocumentJob) -> TranslateTexts:
        """A document job's texts through the dispatcher, by the job's pair, with the
        service's default decoding options; the dispatcher is looked up on the first chunk
        (a job resumed at start-up waits, refused with 503, until the models are ready)."""
        bound: list[TranslateTexts] = []

        async def translate(texts: list[str]) -> list[str]:
            if not bound:
                dispatcher = self.require_dispatcher()
                # background: admitted after interactive requests (service/scheduling/chooser.py)
                options = replace(self.limits.options(None, None), background=True)
                languages = LanguagePair.parse(job.source_lang, job.target_lang)
                memory = MemoryChoice(owner_key=job.owner_key)  # the uploader's memories
                bound.append(document_translator(dispatcher, languages, options, memory))
            return await bound[0](texts)

        return translate

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse new work with 503 from now on; in-flight work goes on."""
        if self.shutdown_deadline is None:
            self.shutdown_deadline = time.monotonic() + self.settings.process.shutdown_grace_s
        if self.phase != "failed":
            self.phase = "shutting_down"
        if self.registry is not None:
            self.registry.begin_shutdown()

    async def shutdown(self) -> None:
        self.begin_shutdown()
        if self._frozen is not None:
            self._frozen.cancel()  # unfreezes the heap
        await self.document_runner.stop()  # jobs in progress are taken up again at the next start
        self.databases.close()
        self.glossaries.database.close()
        self.memories.database.close()
        if self.registry is not None:
            assert self.shutdown_deadline is not None
            grace_left = max(0.0, self.shutdown_deadline - time.monotonic())
            if not await self.registry.shutdown(grace_left):
                logger.warning("shutdown grace elapsed with work unfinished; it was failed")

    def store_unreachable(self) -> str | None:
        """Why the shared database cannot be used now, or None (``/ready``)."""
        return self.databases.unreachable()

    def refresh_phase(self) -> str:
        """The phase, turned to ``failed`` once an engine thread has died: the process can
        no longer serve that model, and ``/health`` must say so for an orchestrator to
        restart it."""
        if self.registry is not None and self.phase != "failed":
            dead = [
                model_id
                for model_id, slot in self.registry.slots.items()
                if slot.model is not None and not slot.model.batcher.alive
            ]
            if dead:
                self.phase = "failed"
                self.detail = (
                    f"the engine thread of {', '.join(dead)} stopped; the process must be restarted"
                )
                logger.critical(self.detail)
        return self.phase

    def require_dispatcher(self) -> Dispatcher:
        self.refresh_phase()
        if self.phase == "ready" and self.dispatcher is not None:
            return self.dispatcher
        reason = {
            "loading": "the model is still loading",
            "shutting_down": "the service is shutting down",
            "failed": self.detail or "the model failed to load",
        }.get(self.phase, self.detail or self.phase)
        raise ApiError(503, f"not_ready_{self.phase}", reason, self.retry_after())

    def describe_error(self, error: BaseException) -> ErrorInfo:
        """The API's answer to ``error`` (service/web/errors.py), with this service's
        Retry-After and request timeout."""
        return describe_error(
            error, self.settings.access.retry_after_s, self.settings.limits.request_timeout_s
        )

    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.access.retry_after_s)}


def lifespan_of(service: ServiceState) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start loading after start-up (``/health`` answers meanwhile); on shutdown refuse new
    work and drain within the grace."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.metrics.threads.register("event_loop")  # this thread runs the event loop
        loading = asyncio.create_task(service.load())
        service.document_runner.start()
        try:
            yield
        finally:
            service.begin_shutdown()
            if not loading.done():
                loading.cancel()
            await service.shutdown()

    return lifespan
