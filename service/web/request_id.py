"""``X-Request-ID`` on every response and in every log line written while serving a request.

A well-formed id sent by the client (or by a gateway in front of us) is kept, so one id
follows a request through the whole chain; anything else is replaced by a fresh one (an id
goes into logs and headers, so it must not carry newlines or unbounded text). The id lives in
a context variable for the duration of the request; ``RequestIdLogFilter`` copies it onto
log records (``%(request_id)s``, ``-`` outside a request).
"""

from __future__ import annotations

import asyncio
import contextvars
import http
import itertools
import logging
import os
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "X-Request-ID"
_HEADER_KEY = HEADER.lower().encode()
_VALID_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")

# Fresh ids: this process's random half, then a count. As unique as a uuid4 per process (the
# random half tells processes and restarts apart) without a random read per request, which
# costs a system call: a visible share of a short request's event-loop time.
_PROCESS_PART = os.urandom(8).hex()
_COUNT = itertools.count()


def _new_process_part() -> None:
    """A forked front-end is another process: its own random half."""
    global _PROCESS_PART, _COUNT
    _PROCESS_PART, _COUNT = os.urandom(8).hex(), itertools.count()


os.register_at_fork(after_in_child=_new_process_part)


def fresh_request_id() -> str:
    """32 hex digits, unique among this process's ids and unlike any other process's."""
    return f"{_PROCESS_PART}{next(_COUNT) & 0xFFFFFFFFFFFFFFFF:016x}"


current_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class RequestId:
    """Outermost middleware: every response, refusals included, carries the id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(_HEADER_KEY)
        request_id = sent.decode() if sent and _VALID_ID.fullmatch(sent) else fresh_request_id()
        token = current_request_id.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k != _HEADER_KEY]
                headers.append((_HEADER_KEY, request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_request_id.reset(token)


class RequestIdLogFilter(logging.Filter):
    """Adds ``request_id`` to every record (attach it to handlers, not loggers, so records
    propagated from any logger get it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id.get()
        return True


ACCESS_FORMAT = (
    '%(asctime)s %(levelname)s access [%(request_id)s]: %(client_addr)s "%(request_line)s" '
    "%(status_code)s"
)


class AccessLineFormatter(logging.Formatter):
    """uvicorn's access line in ``ACCESS_FORMAT``, as uvicorn's ``AccessFormatter`` writes it
    without colours, built in one f-string: the line is written for every request on the
    event loop's thread, and the general path copies the record, looks the status phrase up
    and formats the date each time. Here the date is formatted once a second and each
    status's phrase once."""

    def __init__(self) -> None:
        super().__init__(ACCESS_FORMAT)
        self._second = -1
        self._date = ""
        self._statuses: dict[object, str] = {}

    def _status(self, code: object) -> str:
        try:
            phrase = http.HTTPStatus(int(code)).phrase  # type: ignore[call-overload]
        except ValueError:
            phrase = ""
        self._statuses[code] = text = f"{code} {phrase}"
        return text

    def format(self, record: logging.LogRecord) -> str:
        if not isinstance(record.args, tuple) or len(record.args) != 5 or record.exc_info:
            return super().format(record)  # not uvicorn's access record: no shortcut
        client_addr, method, full_path, http_version, code = record.args
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._date = time.strftime(self.default_time_format, self.converter(record.created))
        status = self._statuses.get(code) or self._status(code)
        return (
            f"{self._date},{int(record.msecs):03d} {record.levelname} access "
            f"[{getattr(record, 'request_id', None)}]: {client_addr} "
            f'"{method} {full_path} HTTP/{http_version}" {status}'
        )


class LoopFlushedHandler(logging.StreamHandler):
    """A stream handler that writes each line at once but flushes its stream once per
    event-loop iteration on the loop's thread (at once on any other): the access line is
    written on the event loop for every response, the responses of a decoder step end in
    one iteration, and each flush of a redirected stream is a write system call."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._flush_pending = False

    def flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            super().flush()
            return
        if not self._flush_pending:
            self._flush_pending = True
            loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_pending = False
        super().flush()


def _loop_flushed(handler: logging.Handler) -> logging.Handler:
    """``handler`` (a plain stream handler, as uvicorn configures its access log) as a
    :class:`LoopFlushedHandler` with the same stream, level, filters and formatter; any
    other handler as it is."""
    if type(handler) is not logging.StreamHandler:
        return handler
    flushed = LoopFlushedHandler(handler.stream)
    flushed.setLevel(handler.level)
    flushed.setFormatter(handler.formatter)
    for log_filter in handler.filters:
        flushed.addFilter(log_filter)
    handler.close()  # leaves logging's list of handlers to flush at exit (the stream stays open)
    return flushed


def install_request_id_logging() -> None:
    """Every handler of the root and uvicorn loggers gets the filter (once: this runs again
    after uvicorn has set up its loggers); uvicorn's access log line gets the id in its format
    (it is written while the request's context is current), and its handler flushes once an
    event-loop iteration."""
    log_filter = RequestIdLogFilter()
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if not any(isinstance(f, RequestIdLogFilter) for f in handler.filters):
                handler.addFilter(log_filter)
            if name == "uvicorn.access":
                handler.setFormatter(AccessLineFormatter())
        if name == "uvicorn.access":
            logger.handlers = [_loop_flushed(handler) for handler in logger.handlers]
