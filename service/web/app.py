"""The FastAPI app: the web layer (service/web/) around one assembled service state.

Routes validate (pydantic models in service/web/schemas.py), then hand texts to the dispatcher
(service/translation/dispatch.py), which picks the models and runs their translators. The
pieces live in service/web/: routes per API in ``routes/`` (``v1``, ``glossaries``, ``documents``,
``stream``, ``libretranslate``, ``deepl``, ``google``, ``files``, ``ops``, ``page``: the page at ``/``),
``errors`` (one error shape, domain errors mapped to statuses), ``middleware`` (body size
limit, request metrics), ``lifecycle`` (background load, graceful shutdown), ``deps`` (what
routes share), ``inflight`` (the in-flight bound that refuses before any work), ``access``
and ``rate_limits`` (API keys, per-client limits) and ``request_id``.

Middleware, outermost first: the client behind trusted proxies (``forwarded``, when
configured), request id, request metrics, CORS (when configured), the in-flight gate (which
checks a header's key and reads the body before taking a slot), the body size limit, and
``direct``, which runs the two translation routes most requests use without the router; so
every response, a refusal included, has an ``X-Request-ID`` and is counted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from fastapi.telemetry import TelemetryConfig
from fastapi_offline import FastAPIOffline

from service.web.access import AccessPolicy
from service.web.direct import DirectRoutes
from service.web.errors import install_error_handlers
from service.web.file_store import TranslatedFiles
from service.web.forwarded import ForwardedClient, TrustedProxies
from service.web.inflight import BodyLimits, InflightGate
from service.web.lifecycle import ServiceState, lifespan_of
from service.web.middleware import BodySizeLimit, RequestMetrics
from service.web.request_id import HEADER, RequestId
from service.web.request_log import RequestLog
from service.web.routes import (
    deepl,
    documents,
    files,
    glossaries,
    google,
    libretranslate,
    memories,
    ops,
    page,
    stream,
    v1,
)

# /docs groups the operations by API: each route module's operations under one tag.
TAGS = {
    "native": "mtserve's own API: /v1/translate, its stream, the models.",
    "LibreTranslate": "LibreTranslate's API, for its clients and its web page's settings.",
    "DeepL": "DeepL's API v2: text, documents, glossaries, usage, languages.",
    "Google": "Google Cloud Translation's API v2 (Basic): translate, detect, languages.",
    "documents": "Document jobs: upload, progress, result.",
    "glossaries and memories": "Stored glossaries and translation memories.",
    "operations": "Health, readiness and Prometheus metrics.",
}
# In the order their routes are matched: a request is matched against each route in turn
# until one fits, so the two translation APIs most requests use come first (no two routers
# share a path, so the order changes nothing else).
ROUTERS = (
    (v1, "native"),
    (libretranslate, "LibreTranslate"),
    (glossaries, "glossaries and memories"),
    (memories, "glossaries and memories"),
    (documents, "documents"),
    (stream, "native"),
    (deepl, "DeepL"),
    (google, "Google"),
    (files, "LibreTranslate"),
    (ops, "operations"),
    (page, "LibreTranslate"),  # /frontend/settings (the page itself is not an operation)
)


# FastAPI asks OpenTelemetry on every request whether a tracer, meter or logger provider has
# been set up (10-18 us of the event loop's time a request). The service reports through
# /metrics and its logs; FastAPI's own telemetry keeps asking only where the environment
# sets OpenTelemetry up.
TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


def telemetry_config(environ: Mapping[str, str] = os.environ) -> TelemetryConfig | None:
    """FastAPI's default (None) where an ``OTEL_*`` variable or ``FASTAPI_OTEL_*`` is set;
    otherwise its per-request checks off."""
    if any(name.startswith(("OTEL_", "FASTAPI_OTEL_")) for name in environ):
        return None
    return TELEMETRY_OFF


def build_app(service: ServiceState) -> FastAPI:
    """The FastAPI app around an assembled service (service/wiring.py builds it)."""
    settings, metrics = service.settings, service.metrics
    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from the package's own
    # files instead of a CDN, so they work on a machine without internet access.
    app = FastAPIOffline(
        title="mtserve",
        summary="Machine translation on ONNX Runtime with continuous batching.",
        version="0.1.0",
        lifespan=lifespan_of(service),
        static_url="/static-docs",
        openapi_tags=[{"name": name, "description": text} for name, text in TAGS.items()],
        telemetry=telemetry_config(),
    )
    app.state.service = service
    app.state.access = AccessPolicy(settings)
    # Where replicas share a database, a download may reach another replica than the upload.
    shared = service.databases.main if service.databases.shared_by_replicas else None
    app.state.translated_files = TranslatedFiles(
        settings.storage.files_dir, settings.storage.files_ttl_s, shared
    )
    for api, tag in ROUTERS:
        app.include_router(api.router, tags=[tag])
    app.mount("/static", StaticFiles(directory=page.STATIC_DIR), name="static")
    install_error_handlers(
        app, metrics, settings.access.retry_after_s, settings.limits.request_timeout_s
    )
    # Innermost: the two translation routes most requests use, run without the router and
    # FastAPI's per-request handling (the same answers; service/web/direct.py).
    app.add_middleware(DirectRoutes, fastapi_app=app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.access.max_body_bytes)
    # Before anything reads the body: under overload a refusal must cost next to nothing.
    app.add_middleware(
        InflightGate,
        max_in_flight=settings.access.max_inflight_requests,
        retry_after_s=settings.access.retry_after_s,
        metrics=metrics,
        access=app.state.access,
        body_limits=BodyLimits(
            settings.access.max_body_bytes,
            settings.access.body_read_timeout_s,
            settings.access.body_min_bytes_per_s,
        ),
    )
    if origins := [o.strip() for o in settings.access.cors_origins.split(",") if o.strip()]:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", HEADER],
            expose_headers=["Retry-After", HEADER],
        )
    app.add_middleware(RequestMetrics, metrics=metrics)  # sees every status
    if settings.process.log_format == "json":
        app.add_middleware(RequestLog)  # inside RequestId: the record has the id
    app.add_middleware(RequestId)  # every response carries the id
    # Outermost: everything inside (limits, logs, uvicorn's access line) sees the client.
    # Without trusted proxies the peer is the client: no layer to pass through.
    if (proxies := TrustedProxies.parse(settings.access.trusted_proxies)).networks:
        app.add_middleware(ForwardedClient, proxies=proxies)
    return app
