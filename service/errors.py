"""The service's error vocabulary: every refusal a layer raises knows its HTTP status and its
machine-readable code, so the web layer maps any of them to a response in one place
(``service/web/errors.py``) and no layer below it knows about HTTP beyond these numbers.

A subclass fixes ``status`` and, where one code fits all its cases, ``code``; an instance may
carry a more specific code (``TextError("too_many_texts", ...)``). ``retry_after`` marks the
refusals a client should retry (429, 503): the response then carries ``Retry-After``.
"""

from __future__ import annotations

from typing import ClassVar


class ServiceError(Exception):
    """A refusal: ``status`` for HTTP, ``code`` for programs, ``message`` for people."""

    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal_error"
    retry_after: ClassVar[bool] = False

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code


# --- the client's input --------------------------------------------------------------------


class TextError(ServiceError):
    """A refusal of the input (HTTP 400)."""

    status = 400
    default_code = "invalid_request"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code)


class InputTooLarge(TextError):
    """Too many texts, characters, sentences or tokens (HTTP 413)."""

    status = 413


class InvalidInput(TextError):
    """A request the limits do not allow: no texts, options above their limits (HTTP 422)."""

    status = 422


class UnsupportedLanguage(TextError):
    """No model (direct or pivot) translates the requested pair (HTTP 400)."""


class NotFound(ServiceError):
    """A stored thing (a glossary) the client names does not exist (HTTP 404)."""

    status = 404
    default_code = "not_found"


class UnsupportedFile(ServiceError, ValueError):
    """A file whose format or content cannot be translated (HTTP 400)."""

    status = 400
    default_code = "invalid_request"


# --- the scheduler ---------------------------------------------------------------------------


class QueueFull(ServiceError):
    """The queue cannot take the request's sentences now; the client should retry."""

    status = 429
    default_code = "queue_full"
    retry_after = True


class NotAccepting(ServiceError):
    """The batcher is shutting down (or stopped); ``code`` says which."""

    status = 503
    retry_after = True

    def __init__(self, reason: str = "shutting_down") -> None:
        super().__init__(f"the service is not accepting work ({reason.replace('_', ' ')})", reason)

    @property
    def reason(self) -> str:
        return self.code


class InvalidRow(ServiceError):
    """The engine refused this row alone (``Engine.add``'s rejection); the others proceed."""

    status = 422
    default_code = "invalid_sentence"


class EngineFailure(ServiceError):
    """The engine raised while this row was in the batch."""

    status = 500
    default_code = "engine_failure"


class EngineUnavailable(ServiceError):
    """No engine core of the model answers (none started yet, or the one holding this row
    died): the supervisor restarts it, so the client should retry."""

    status = 503
    default_code = "engine_unavailable"
    retry_after = True


class StoreUnavailable(ServiceError):
    """The store cannot be used now: the shared database (``MT_DATABASE_URL``) does not
    answer, or the data directory (``MT_DATA_DIR``) cannot be written. The client should retry;
    ``/ready`` says 503 and why meanwhile."""

    status = 503
    default_code = "store_unavailable"
    retry_after = True


# --- models ----------------------------------------------------------------------------------


class ModelNotReady(ServiceError):
    """The model a request needs is loading (``MT_COLD_START=reject``) or failed to load."""

    status = 503
    retry_after = True

    def __init__(self, model_id: str, state: str, detail: str) -> None:
        super().__init__(detail, "model_failed" if state == "failed" else "model_loading")
        self.model_id = model_id
        self.state = state
        self.detail = detail


class ApiError(ServiceError):
    """A refusal the web layer decides itself (keys, rate limits, readiness, malformed
    bodies): the status is the instance's."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, code)
        self.status = status  # type: ignore[misc]  # per instance, not per class
        self.headers = headers
