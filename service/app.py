"""The HTTP API: an app factory, thin routes, error handlers and two small ASGI middlewares.

Routes validate (pydantic models in service/schemas.py), then hand texts to the translator
(service/translator.py), which feeds the continuous batcher (service/batcher.py). The engine
loads in the background after start-up, so ``/health`` answers at once and ``/ready`` says
503 until the model is loaded and warmed up.

Every error body is ``{"error": message, "code": machine_code}``: ``error`` is the field
LibreTranslate clients read, so both APIs share one shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.batcher import ContinuousBatcher, EngineFailure, NotAccepting, QueueFull
from service.engine import Engine
from service.metrics import ServiceMetrics
from service.schemas import (
    DetectedLanguage,
    ErrorResponse,
    Language,
    LibreTranslateRequest,
    LibreTranslateResponse,
    ModelCard,
    ModelList,
    Status,
    TranslateRequest,
    TranslateResponse,
    Translation,
    Usage,
)
from service.settings import Settings, get_settings
from service.translator import ApiError, Translator

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_SOURCE_LANG, DEFAULT_TARGET_LANG = "en", "de"
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "fi": "Finnish", "fr": "French", "hu": "Hungarian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "no": "Norwegian",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish",
    "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip
_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 413, 422, 429, 503, 504)
}


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
    """What the routes need, on ``app.state.service``: phase, model facts, the translator."""

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
        except Exception as error:
            logger.exception("loading the model from %s failed", settings.model_dir)
            self.phase, self.detail = "failed", f"loading the model failed: {error}"
            return
        self.engine = engine
        self.model_name = (
            settings.model_name or getattr(engine, "model_name", "") or self.model_name
        )
        self.provider = getattr(engine, "provider", self.provider)
        self.batcher = ContinuousBatcher(
            engine,
            max_batch_rows=settings.max_batch_rows,
            max_batch_tokens=settings.max_batch_tokens,
            max_queue=settings.max_queue,
            metrics=self.metrics,
            batching=settings.batching,
            static_max_wait_s=settings.static_max_wait_ms / 1000,
        )
        self.batcher.start()
        model_info = getattr(getattr(engine, "model", None), "info", None)
        self.translator = Translator(
            engine.tokenizer,
            self.batcher,
            settings,
            self.source_lang,
            model_positions=getattr(model_info, "max_positions", None),
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

    async def run(self, request: Request, work: Awaitable[T]) -> T:
        """Await ``work`` unless the client hangs up first (then it is cancelled, which drops
        its rows from the batch); turn the batcher's refusals into HTTP errors."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.settings.disconnect_poll_s)
                if done:
                    break
                if await request.is_disconnected():
                    task.cancel()
                    raise ApiError(499, "client_disconnected", "the client closed the connection")
            try:
                return task.result()
            except QueueFull as error:
                raise ApiError(429, "queue_full", str(error), self.retry_after()) from error
            except NotAccepting as error:
                raise ApiError(503, error.reason, str(error), self.retry_after()) from error
            except TimeoutError as error:
                raise ApiError(
                    504,
                    "timeout",
                    f"translation took longer than MT_REQUEST_TIMEOUT_S="
                    f"{self.settings.request_timeout_s:g} s; its sentences were dropped",
                ) from error
            except EngineFailure as error:
                raise ApiError(500, "engine_failure", str(error)) from error
        finally:
            if not task.done():
                task.cancel()


def get_service(request: Request) -> ServiceState:
    return request.app.state.service


Service = Annotated[ServiceState, Depends(get_service)]
router = APIRouter()


@router.post(
    "/v1/translate",
    response_model=TranslateResponse,
    responses=_ERROR_RESPONSES,
    summary="Translate one text or a list of texts",
)
async def translate(
    body: TranslateRequest, request: Request, service: Service
) -> TranslateResponse:
    started = time.perf_counter()
    translator = service.require_translator()
    service.check_languages(body.source_lang, body.target_lang)
    texts = [body.text] if isinstance(body.text, str) else body.text
    options = translator.options(body.beam_size, body.max_new_tokens)
    batch = await service.run(request, translator.translate(texts, options))
    return TranslateResponse(
        translations=[
            Translation(text=t.text, tokens=t.output_tokens, sentences=t.sentences)
            for t in batch.translations
        ],
        model=service.model_name,
        source_lang=service.source_lang,
        target_lang=service.target_lang,
        usage=Usage(
            input_tokens=batch.input_tokens,
            output_tokens=batch.output_tokens,
            sentences=batch.decoded_sentences,
            cached_sentences=batch.cached_sentences,
        ),
        time_ms=round((time.perf_counter() - started) * 1000, 3),
    )


_LIBRETRANSLATE_BODY_SCHEMA = LibreTranslateRequest.model_json_schema()


@router.post(
    "/translate",
    response_model=LibreTranslateResponse,
    response_model_exclude_none=True,
    responses={**_ERROR_RESPONSES},
    summary="LibreTranslate-compatible translation (JSON or form body)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _LIBRETRANSLATE_BODY_SCHEMA},
                "application/x-www-form-urlencoded": {"schema": _LIBRETRANSLATE_BODY_SCHEMA},
                "multipart/form-data": {"schema": _LIBRETRANSLATE_BODY_SCHEMA},
            },
        }
    },
)
async def libretranslate(request: Request, service: Service) -> LibreTranslateResponse:
    body = await _read_libretranslate_body(request)
    translator = service.require_translator()
    service.check_languages(body.source, body.target)
    texts = [body.q] if isinstance(body.q, str) else body.q
    options = translator.options(None, None)
    batch = await service.run(request, translator.translate(texts, options))
    translated = [t.text for t in batch.translations]
    detected = None
    if body.source.lower() == "auto":
        one = DetectedLanguage(language=service.source_lang, confidence=100.0)
        detected = one if isinstance(body.q, str) else [one] * len(texts)
    return LibreTranslateResponse(
        translatedText=translated[0] if isinstance(body.q, str) else translated,
        detectedLanguage=detected,
    )


async def _read_libretranslate_body(request: Request) -> LibreTranslateRequest:
    """LibreTranslate clients send JSON or form fields; both end up in one model."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    data: Any
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        data = {key: form.get(key) for key in form}
        if len(questions := form.getlist("q")) > 1:
            data["q"] = questions  # q repeated: a list of texts
    else:
        raw = await request.body()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as error:
            raise ApiError(400, "malformed_json", f"malformed JSON body: {error}") from error
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "Invalid request: the body must be a JSON object")
    try:
        return LibreTranslateRequest.model_validate(data)
    except ValidationError as error:
        raise ApiError(
            400, "invalid_request", f"Invalid request: {_describe(error.errors())}"
        ) from error


@router.get("/languages", response_model=list[Language], summary="Languages (LibreTranslate)")
async def languages(service: Service) -> list[Language]:
    source, target = service.source_lang, service.target_lang
    return [
        Language(code=source, name=LANGUAGE_NAMES.get(source, source), targets=[target]),
        Language(code=target, name=LANGUAGE_NAMES.get(target, target), targets=[]),
    ]


@router.get("/v1/models", response_model=ModelList, summary="The model this process serves")
async def models(service: Service) -> ModelList:
    return ModelList(
        data=[
            ModelCard(
                id=service.model_name,
                source_lang=service.source_lang,
                target_lang=service.target_lang,
                provider=service.provider,
                ready=service.phase == "ready",
            )
        ]
    )


@router.get("/health", response_model=Status, summary="Process alive (503 if the model failed)")
async def health(service: Service) -> Response:
    if service.phase == "failed":
        return JSONResponse({"status": "failed", "detail": service.detail}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready", response_model=Status, summary="Model loaded and warmed up")
async def ready(service: Service) -> Response:
    if service.phase == "ready":
        return JSONResponse({"status": "ready"})
    return JSONResponse(
        {"status": service.phase, "detail": service.detail},
        status_code=503,
        headers=service.retry_after(),
    )


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(service: Service) -> Response:
    return Response(service.metrics.render(), media_type=service.metrics.content_type)


# --- errors --------------------------------------------------------------------------------


def _describe(errors: Any) -> str:
    """One readable line from pydantic's error list: ``text: Input should be …``."""
    parts = []
    for error in errors:
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{location}: {error.get('msg')}" if location else str(error.get("msg")))
    return "; ".join(dict.fromkeys(parts))


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI, metrics: ServiceMetrics) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        metrics.rejections.labels(reason=error.code).inc()
        return _error(error.status_code, error.code, error.message, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid")
            reason = (detail.get("ctx") or {}).get("error", "JSON decode error")
            metrics.rejections.labels(reason="malformed_json").inc()
            return _error(400, "malformed_json", f"malformed JSON body: {reason}")
        metrics.rejections.labels(reason="invalid_request").inc()
        return _error(422, "invalid_request", f"invalid request: {_describe(errors)}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return _error(
            error.status_code, f"http_{error.status_code}", str(error.detail), error.headers
        )

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=error)
        return _error(500, "internal_error", "internal server error")


# --- middleware ----------------------------------------------------------------------------


class BodySizeLimit:
    """413 for bodies over ``max_bytes``: at once from Content-Length, or while reading a
    chunked body (the route's body read then fails with the 413)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"request body is larger than MT_MAX_BODY_BYTES={self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = _error(413, "body_too_large", self._message())
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, limited_receive, send)


class RequestMetrics:
    """Count and time every request by route template and status (Triton-style)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = scope.get("route")
            # The route template, not the raw path, so label values stay few.
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(route=label, status=str(status)).inc()
            self.metrics.request_latency.labels(route=label, status=str(status)).observe(
                time.perf_counter() - started
            )


# --- factory -------------------------------------------------------------------------------


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """The app. ``engine``: an already built engine (tests); else it is loaded from
    ``settings.model_dir`` in the background after start-up."""
    settings = settings or get_settings()
    metrics = ServiceMetrics()
    service = ServiceState(settings, metrics)

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

    app = FastAPI(
        title="mtserve",
        summary="Machine translation on ONNX Runtime with continuous batching.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = service
    app.include_router(router)
    _install_error_handlers(app, metrics)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)  # outermost: sees every status
    return app
