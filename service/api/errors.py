"""Every error the API returns, and the mapping from domain errors to HTTP statuses.

Every error body is ``{"error": message, "code": machine_code}``: ``error`` is the field
LibreTranslate clients read, so both APIs share one shape. Domain errors come from the text
pipeline (``InputTooLarge`` → 413, ``InvalidInput`` → 422), the router
(``UnsupportedLanguage`` → 400, with LibreTranslate's messages) and the registry
(``ModelNotReady`` → 503 + Retry-After); the batcher's refusals are mapped where requests
await it (service/api/deps.py).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.metrics import ServiceMetrics
from service.registry import ModelNotReady
from service.schemas import ErrorResponse
from service.text_pipeline import InputTooLarge, InvalidInput, TextError

logger = logging.getLogger(__name__)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 413, 422, 429, 503, 504)
}


class ApiError(Exception):
    """A refusal with an HTTP status, a machine-readable code and a message for people."""

    def __init__(
        self, status_code: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.headers = headers


def status_of(error: TextError) -> int:
    """The HTTP status of a text pipeline refusal."""
    if isinstance(error, InputTooLarge):
        return 413
    if isinstance(error, InvalidInput):
        return 422
    return 400


def describe(errors: Any) -> str:
    """One readable line from pydantic's error list: ``text: Input should be …``."""
    parts = []
    for error in errors:
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{location}: {error.get('msg')}" if location else str(error.get("msg")))
    return "; ".join(dict.fromkeys(parts))


class ErrorJSONResponse(JSONResponse):
    """Error messages may quote what the client sent (a field name, a language code), which
    can hold anything, an unpaired surrogate included: escaped to ASCII, every error body
    encodes, so no error turns into a 500 while being reported."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return ErrorJSONResponse({"error": message, "code": code}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI, metrics: ServiceMetrics, retry_after_s: int) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        metrics.rejections.labels(reason=error.code).inc()
        logger.info("refused with %d %s: %s", error.status_code, error.code, error.message)
        return error_response(error.status_code, error.code, error.message, error.headers)

    @app.exception_handler(TextError)
    async def text_error(_: Request, error: TextError) -> JSONResponse:
        metrics.rejections.labels(reason=error.code).inc()
        logger.info("refused with %d %s: %s", status_of(error), error.code, error.message)
        return error_response(status_of(error), error.code, error.message)

    @app.exception_handler(ModelNotReady)
    async def model_not_ready(_: Request, error: ModelNotReady) -> JSONResponse:
        code = "model_failed" if error.state == "failed" else "model_loading"
        metrics.rejections.labels(reason=code).inc()
        return error_response(503, code, error.detail, {"Retry-After": str(retry_after_s)})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid")
            reason = (detail.get("ctx") or {}).get("error", "JSON decode error")
            metrics.rejections.labels(reason="malformed_json").inc()
            return error_response(400, "malformed_json", f"malformed JSON body: {reason}")
        metrics.rejections.labels(reason="invalid_request").inc()
        return error_response(422, "invalid_request", f"invalid request: {describe(errors)}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(
            error.status_code, f"http_{error.status_code}", str(error.detail), error.headers
        )

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=error)
        return error_response(500, "internal_error", "internal server error")
