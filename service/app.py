"""The app factory: the web layer (service/api/) assembled around one service state.

Routes validate (pydantic models in service/schemas.py), then hand texts to the translator
(service/translator.py), which runs the text pipeline (service/text_pipeline.py) and feeds
the continuous batcher (service/batcher.py). The pieces live in service/api/: routes per API
(``v1``, ``stream``, ``libretranslate``, ``files``, ``ops``, ``web``: the page at ``/``),
``errors`` (one error shape, domain errors mapped to statuses), ``middleware`` (body size
limit, request metrics), ``lifecycle`` (background load, graceful shutdown), ``deps`` (what
routes share), ``admission`` (the in-flight bound that refuses before any work), ``access``
and ``rate_limits`` (API keys, per-client limits) and ``request_id``.

Middleware, outermost first: request id, request metrics, CORS (when configured), the
admission gate, the body size limit; so every response, a refusal included, has an
``X-Request-ID`` and is counted.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from service.api import files, libretranslate, ops, stream, v1, web
from service.api.access import AccessPolicy
from service.api.admission import AdmissionGate
from service.api.errors import install_error_handlers
from service.api.lifecycle import ServiceState, engine_loader, lifespan_of
from service.api.middleware import BodySizeLimit, RequestMetrics
from service.api.request_id import HEADER, RequestId
from service.engine import Engine
from service.file_store import TranslatedFiles
from service.metrics import ServiceMetrics
from service.registry import EngineLoader
from service.settings import Settings, get_settings


def create_app(
    settings: Settings | None = None,
    engine: Engine | None = None,
    load_engine: EngineLoader | None = None,
) -> FastAPI:
    """The app. Models are found from the settings (service/registry.py) and loaded in the
    background after start-up. ``engine``: an already built engine for a single model;
    ``load_engine``: builds each model's engine from its spec (tests wrap engines this way)."""
    settings = settings or get_settings()
    metrics = ServiceMetrics()
    if load_engine is None:
        load_engine = engine_loader(settings) if engine is None else (lambda _spec: engine)
    service = ServiceState(settings, metrics, load_engine)
    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from the package's own
    # files instead of a CDN, so they work on a machine without internet access.
    app = FastAPIOffline(
        title="mtserve",
        summary="Machine translation on ONNX Runtime with continuous batching.",
        version="0.1.0",
        lifespan=lifespan_of(service),
        static_url="/static-docs",
    )
    app.state.service = service
    app.state.access = AccessPolicy(settings)
    app.state.translated_files = TranslatedFiles(settings.files_dir, settings.files_ttl_s)
    for api in (v1, stream, libretranslate, files, ops, web):
        app.include_router(api.router)
    app.mount("/static", StaticFiles(directory=web.STATIC_DIR), name="static")
    install_error_handlers(app, metrics, settings.retry_after_s)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    # Before anything reads the body: under overload a refusal must cost next to nothing.
    app.add_middleware(
        AdmissionGate,
        max_in_flight=settings.max_inflight_requests,
        retry_after_s=settings.retry_after_s,
        metrics=metrics,
    )
    if origins := [o.strip() for o in settings.cors_origins.split(",") if o.strip()]:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", HEADER],
            expose_headers=["Retry-After", HEADER],
        )
    app.add_middleware(RequestMetrics, metrics=metrics)  # sees every status
    app.add_middleware(RequestId)  # outermost: every response carries the id
    return app
