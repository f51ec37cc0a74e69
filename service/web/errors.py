"""Every error the API returns: one mapping from the service's errors to one body.

Every error body is ``{"error": message, "code": machine_code}``: ``error`` is the field
LibreTranslate clients read, so both APIs share one shape (DeepL's adds ``message``; Google's
API has its own, ``error_body``). The errors come from every layer
as ``service.errors.ServiceError`` subclasses, each with its status and code; ``describe_error``
turns any exception into ``(status, code, message, headers)`` and is the one place that does
so: the exception handlers, the streaming route's ``event: error`` and the file routes use it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import ApiError, ServiceError
from service.metrics import ServiceMetrics
from service.web.schemas import ErrorResponse

__all__ = ["ApiError", "ERROR_RESPONSES", "describe_error", "install_error_handlers"]

logger = logging.getLogger(__name__)
Model = TypeVar("Model", bound=BaseModel)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 413, 422, 429, 503, 504)
}


@dataclass(frozen=True)
class ErrorInfo:
    status: int
    code: str
    message: str
    headers: dict[str, str] | None = None


def describe_error(error: BaseException, retry_after_s: int, timeout_s: float) -> ErrorInfo:
    """The API's answer to any exception a request raised: a ``ServiceError`` says its own
    status and code; a timeout is 504; anything else is a 500 that says nothing of its cause
    (the log has it)."""
    if isinstance(error, ServiceError):
        headers = getattr(error, "headers", None)
        if error.retry_after:
            headers = {**(headers or {}), "Retry-After": str(retry_after_s)}
        return ErrorInfo(error.status, error.code, error.message, headers)
    if isinstance(error, TimeoutError):
        return ErrorInfo(
            504,
            "timeout",
            f"translation took longer than MT_REQUEST_TIMEOUT_S={timeout_s:g} s; "
            "its unfinished sentences were dropped",
        )
    return ErrorInfo(500, "internal_error", "internal server error")


def describe_validation(errors: Any) -> str:
    """One readable line from pydantic's error list: ``text: Input should be …``."""
    parts = []
    for error in errors:
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{location}: {error.get('msg')}" if location else str(error.get("msg")))
    return "; ".join(dict.fromkeys(parts))


def validated(model: type[Model], data: Any, context: str) -> Model:
    """``data`` read as ``model``, for a body a route reads by hand: what pydantic refuses is
    a 400 whose message is ``context``, a colon and :func:`describe_validation`'s line."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        message = f"{context}: {describe_validation(error.errors())}"
        raise ApiError(400, "invalid_request", message) from error


class ErrorJSONResponse(JSONResponse):
    """Error messages may quote what the client sent (a field name, a language code), which
    can hold anything, an unpaired surrogate included: escaped to ASCII, every error body
    encodes, so no error turns into a 500 while being reported."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


# Google's Cloud Translation v2 API (service/web/routes/google.py): its clients read its own
# error shape, and google.api_core names the error by ``status``.
GOOGLE_PREFIX = "/language/translate/v2"
GOOGLE_STATUS = {
    400: ("INVALID_ARGUMENT", "invalid"),
    401: ("UNAUTHENTICATED", "unauthorized"),
    403: ("PERMISSION_DENIED", "forbidden"),
    404: ("NOT_FOUND", "notFound"),
    405: ("INVALID_ARGUMENT", "invalid"),
    408: ("DEADLINE_EXCEEDED", "timeout"),
    413: ("INVALID_ARGUMENT", "requestTooLarge"),
    422: ("INVALID_ARGUMENT", "invalid"),
    429: ("RESOURCE_EXHAUSTED", "rateLimitExceeded"),
    499: ("CANCELLED", "cancelled"),
    503: ("UNAVAILABLE", "backendError"),
    504: ("DEADLINE_EXCEEDED", "backendError"),
}


def error_body(path: str, status: int, code: str, message: str) -> dict[str, Any]:
    """The error body of the API ``path`` belongs to: ``{"error": message, "code": code}``
    (with DeepL's ``message`` on ``/v2/``), or Google's ``{"error": {"code", "message",
    "errors", "status"}}`` on its API."""
    if path.startswith(GOOGLE_PREFIX):
        name, reason = GOOGLE_STATUS.get(status, ("INTERNAL", "backendError"))
        detail = {"message": message, "domain": "global", "reason": reason}
        return {"error": {"code": status, "message": message, "errors": [detail], "status": name}}
    body = {"error": message, "code": code}
    if path.startswith("/v2/"):
        body["message"] = message  # DeepL's field: its clients show it
    return body


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    request: Request | None = None,
) -> JSONResponse:
    path = request.url.path if request is not None else ""
    return ErrorJSONResponse(
        error_body(path, status, code, message), status_code=status, headers=headers
    )


def install_error_handlers(
    app: FastAPI, metrics: ServiceMetrics, retry_after_s: int, timeout_s: float
) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, error: ServiceError | TimeoutError) -> JSONResponse:
        info = describe_error(error, retry_after_s, timeout_s)
        metrics.rejections.labels(reason=info.code).inc()
        logger.info("refused with %d %s: %s", info.status, info.code, info.message)
        return error_response(info.status, info.code, info.message, info.headers, request)

    @app.exception_handler(TimeoutError)
    async def timed_out(request: Request, error: TimeoutError) -> JSONResponse:
        return await service_error(request, error)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid")
            reason = (detail.get("ctx") or {}).get("error", "JSON decode error")
            metrics.rejections.labels(reason="malformed_json").inc()
            return error_response(
                400, "malformed_json", f"malformed JSON body: {reason}", request=request
            )
        metrics.rejections.labels(reason="invalid_request").inc()
        message = f"invalid request: {describe_validation(errors)}"
        return error_response(422, "invalid_request", message, request=request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(
            error.status_code,
            f"http_{error.status_code}",
            str(error.detail),
            error.headers,
            request,
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=error)
        return error_response(500, "internal_error", "internal server error", request=request)
