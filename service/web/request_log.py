"""``MT_LOG_FORMAT=json``: one JSON object per log line, and one record per request with
what an operator filters on: request id, route, status, model, latency, characters and the
client's key id (a hash of the API key, never the key).

``RequestLog`` (middleware) writes the request record once the response has started;
``note_client`` (called by the access policy, which sees the key and the characters) fills
in the client's part. Plain text stays the default (uvicorn's access line then says what
``RequestLog`` would).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.web.request_id import RequestIdLogFilter, current_request_id

logger = logging.getLogger("mtserve.requests")
MODELS_HEADER_KEY = b"x-translation-models"  # service/web/routes/v1.py MODELS_HEADER
# The request record's fields, in the order a JSON line shows them.
REQUEST_FIELDS = ("route", "method", "status", "model", "latency_ms", "characters", "key_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [{role}%(request_id)s]: %(message)s"


@dataclass
class ClientFacts:
    characters: int = 0
    key_id: str | None = None


_client: contextvars.ContextVar[ClientFacts | None] = contextvars.ContextVar(
    "client_facts", default=None
)


def key_id(key: str) -> str:
    """An API key's id in logs: enough of its SHA-256 to tell keys apart, nothing to use."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def note_client(key: str | None, characters: int) -> None:
    """The current request's API key (kept as its id) and characters charged so far."""
    if (facts := _client.get()) is None:
        return
    facts.characters += characters
    if key is not None:
        facts.key_id = key_id(key)


class RequestLog:
    """Logs one record per HTTP request, with ``REQUEST_FIELDS`` as record attributes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        facts = ClientFacts()
        token = _client.set(facts)
        status, model = 500, ""

        async def send_noting(message: Message) -> None:
            nonlocal status, model
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = dict(message.get("headers") or [])
                model = headers.get(MODELS_HEADER_KEY, b"").decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, send_noting)
        finally:
            _client.reset(token)
            route = scope.get("route")
            fields = {
                "route": route.path if route is not None else scope.get("path", ""),
                "method": scope.get("method", ""),
                "status": status,
                "model": model or None,
                "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                "characters": facts.characters,
                "key_id": facts.key_id,
            }
            logger.info("%s %s %d", fields["method"], fields["route"], status, extra=fields)


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, request id, and the
    request fields where the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or current_request_id.get(),
            "pid": record.process,  # which process of the multi-process service wrote it
        }
        line |= {name: getattr(record, name) for name in REQUEST_FIELDS if hasattr(record, name)}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str, role: str = "") -> None:
    """The root logger's handler: ``TEXT_FORMAT`` lines (``role`` names the process in each:
    ``front-end %(process)d``), or JSON objects; each with the current request's id."""
    prefix = f"{role} " if role else ""
    logging.basicConfig(level=level.upper(), format=TEXT_FORMAT.format(role=prefix))
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RequestIdLogFilter) for f in handler.filters):
            handler.addFilter(RequestIdLogFilter())
    if log_format == "json":
        use_json_format()


def use_json_format(names: tuple[str, ...] = ("", "uvicorn", "uvicorn.error")) -> None:
    """Every handler of these loggers writes JSON (again after uvicorn configured its own)."""
    for name in names:
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(JsonFormatter())
