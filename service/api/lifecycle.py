"""The service's life: load and warm the engine in the background, start the batcher, refuse
new work from SIGTERM on and drain in-flight work within the grace.

``ServiceState`` lives on ``app.state.service``: phase, model facts and the translator, the
things routes need. ``/health`` answers at once; ``/ready`` says 503 until the model is
loaded and warmed up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from service.api.errors import ApiError
from service.batcher import BatchingConfig, ContinuousBatcher
from service.engine import Engine
from service.metrics import ServiceMetrics
from service.settings import Settings
from service.translator import Translator

logger = logging.getLogger(__name__)

DEFAULT_SOURCE_LANG, DEFAULT_TARGET_LANG = "en", "de"


def read_language_pair(model_dir: Path) -> tuple[str, str]:
    """The model's (source, target) language from the export's ``config.json`` (or the
    tokenizer's config), else en→de."""
    for name in ("config.json", "tokenizer_config.json"):
        path = model_dir / name
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        source, target = config.get("source_lang"), config.get("target_lang")
        if isinstance(source, str) and isinstance(target, str) and source and target:
            return source.lower(), target.lower()
    return DEFAULT_SOURCE_LANG, DEFAULT_TARGET_LANG


class ServiceState:
    """What the routes need: phase, model facts, the translator."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.phase = "loading"  # loading → ready → shutting_down; or failed
        self.detail: str | None = None
        self.engine: Engine | None = None
        self.batcher: ContinuousBatcher | None = None
        self.translator: Translator | None = None
        self.source_lang, self.target_lang = read_language_pair(Path(settings.model_dir))
        self.model_name = settings.model_name or Path(settings.model_dir).name
        self.provider = settings.provider
        # Set by the first begin_shutdown: the grace counts from SIGTERM, not from when the
        # server gets round to the lifespan shutdown.
        self.shutdown_deadline: float | None = None

    async def load(self, engine: Engine | None = None) -> None:
        """Load (unless given) and warm up the engine, then start the batcher."""
        settings = self.settings
        try:
            if engine is None:
                engine = await asyncio.to_thread(
                    Engine.from_dir,
                    settings.model_dir,
                    provider=settings.provider,
                    intra_op_threads=settings.intra_op_threads,
                )
            await asyncio.to_thread(engine.warmup)
            if settings.admission_cost_aware and settings.batching == "continuous":
                await asyncio.to_thread(engine.calibrate)
        except Exception as error:
            logger.exception("loading the model from %s failed", settings.model_dir)
            self.phase, self.detail = "failed", f"loading the model failed: {error}"
            return
        self.engine = engine
        self.model_name = settings.model_name or engine.model_name or self.model_name
        self.provider = engine.provider
        self.batcher = ContinuousBatcher(
            engine, BatchingConfig.from_settings(settings), metrics=self.metrics
        )
        self.batcher.start()
        self.translator = Translator(
            engine.tokenizer,
            self.batcher,
            settings,
            self.source_lang,
            model_positions=engine.model.info.max_positions,
        )
        if self.phase == "loading":
            self.phase = "ready"
            logger.info("model %s ready on %s", self.model_name, self.provider)

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse new work with 503 from now on; in-flight work goes on."""
        if self.shutdown_deadline is None:
            self.shutdown_deadline = time.monotonic() + self.settings.shutdown_grace_s
        if self.phase != "failed":
            self.phase = "shutting_down"
        if self.batcher is not None:
            self.batcher.begin_shutdown()

    async def shutdown(self) -> None:
        self.begin_shutdown()
        if self.batcher is not None:
            assert self.shutdown_deadline is not None
            grace_left = max(0.0, self.shutdown_deadline - time.monotonic())
            drained = await self.batcher.shutdown(grace_left)
            if not drained:
                logger.warning("shutdown grace elapsed with work unfinished; it was failed")

    def require_translator(self) -> Translator:
        if self.phase == "ready" and self.translator is not None:
            return self.translator
        reason = {
            "loading": "the model is still loading",
            "shutting_down": "the service is shutting down",
            "failed": self.detail or "the model failed to load",
        }.get(self.phase, self.phase)
        raise ApiError(503, f"not_ready_{self.phase}", reason, self.retry_after())

    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    def check_languages(self, source: str | None, target: str | None) -> None:
        source = (source or "auto").lower()
        target = (target or self.target_lang).lower()
        if source not in ("auto", self.source_lang) or target != self.target_lang:
            raise ApiError(
                400,
                "unsupported_language",
                f"unsupported language pair {source}→{target}: model {self.model_name} "
                f"translates {self.source_lang}→{self.target_lang} (source 'auto' is accepted)",
            )


def lifespan_of(
    service: ServiceState, engine: Engine | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start loading after start-up (``/health`` answers meanwhile); on shutdown refuse new
    work and drain within the grace."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(service.load(engine))
        try:
            yield
        finally:
            service.begin_shutdown()
            if not loading.done():
                loading.cancel()
            await service.shutdown()

    return lifespan
