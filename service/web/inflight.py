"""The in-flight gate: decide whether to take a translation request on *before* any work is
done for it (the scheduler's admission, service/scheduling/, decides later which queued rows
join the batch).

Under overload the costly part of a refusal is everything done before it: reading and parsing
the body, validating it, splitting and tokenizing the texts, all on the event loop that also
answers ``/health`` and hands results back. Refusing only when the batcher's queue is full
(after all of that) lets the loop fall behind until even the refusals take tens of seconds.

So, as TGI does with a semaphore it tries without waiting, a bound on translation requests in
flight (``MT_MAX_INFLIGHT_REQUESTS``) is checked first, as an ASGI middleware: the request is
answered 429 with ``Retry-After`` from its headers alone, its body never read. Requests that
get in are bounded too, so their queueing time (Little's law: in flight / throughput) stays
well inside ``MT_REQUEST_TIMEOUT_S``. The batcher's queue bound (in sentences) stays as the
second line for requests with many sentences.

The counter is only touched on the event loop (one thread), so it needs no lock; "tried
without waiting" is a comparison and an increment with no ``await`` in between.

**Bodies are read before the slot is taken**, under a count of their own (four per slot):
a client that sends its body slowly (or never finishes it) holds no in-flight slot, and is
cut off with 408 when its body takes longer than ``MT_BODY_READ_TIMEOUT_S`` or falls below
``MT_BODY_MIN_BYTES_PER_S`` on average after a short grace. A key that travels in a header
is checked before the body too: a wrong or missing one costs no body read.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics
from service.web.access import AccessPolicy
from service.web.errors import GOOGLE_PREFIX, ApiError, ErrorJSONResponse, error_body

# The API routes that take translation work; everything else (health, metrics, docs) is
# always answered.
TRANSLATION_ROUTES = frozenset(
    {
        "/v1/translate",
        "/v1/translate/stream",
        "/translate",
        "/translate_file",
        "/detect",
        "/v2/translate",
        # Uploads: their parsing and checks take a worker thread, as a translation does.
        "/v1/documents",
        "/v2/document",
        "/language/translate/v2",
        "/language/translate/v2/detect",
    }
)


# Google's API takes a translation's fields in the query string as well: its GETs are
# translation work too.
QUERY_TRANSLATION_ROUTES = frozenset({"/language/translate/v2", "/language/translate/v2/detect"})


# A body may start slowly (a client's first packets, a TLS proxy buffering): the minimum
# rate holds from this many seconds after the request's start.
BODY_GRACE_S = 5.0


# Bodies read at once, per in-flight slot: enough that clients trickling their bodies do not
# shut out the others (each is cut off after the grace), few enough to bound the memory held
# by bodies that stall near their end (this many times MT_MAX_BODY_BYTES per slot).
READING_PER_SLOT = 4


@dataclass(frozen=True)
class BodyLimits:
    """How a request body must arrive: within ``timeout_s`` in all, at ``min_bytes_per_s``
    on average after :data:`BODY_GRACE_S`, and no larger than ``max_bytes``."""

    max_bytes: int
    timeout_s: float = 30.0
    min_bytes_per_s: int = 1024

    def seconds_allowed(self, received: int) -> float:
        """How long after the start the body may still be arriving, ``received`` bytes in."""
        return min(self.timeout_s, BODY_GRACE_S + received / max(self.min_bytes_per_s, 1))


class SlowBody(Exception):
    pass


async def read_body(receive: Receive, limits: BodyLimits) -> tuple[bytes, bool]:
    """The whole body, and whether it fit ``max_bytes`` (reading stops past it); raises
    :class:`SlowBody` where it arrives too slowly and ``ConnectionError`` when the client
    goes away."""
    started, received, chunks = time.monotonic(), 0, []
    while True:
        wait_s = started + limits.seconds_allowed(received) - time.monotonic()
        if wait_s <= 0:
            raise SlowBody
        try:
            # A deadline on this task, not ``wait_for``'s task per read (3.11)
            async with asyncio.timeout(wait_s):
                message = await receive()
        except TimeoutError:
            raise SlowBody from None
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away mid-body")
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limits.max_bytes:
            return b"", False
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), True


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then what the client sends next (its
    disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class InflightGate:
    """429 at once for translation requests beyond ``max_in_flight`` concurrent ones."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        retry_after_s: int,
        metrics: ServiceMetrics,
        routes: Collection[str] = TRANSLATION_ROUTES,
        access: AccessPolicy | None = None,
        body_limits: BodyLimits | None = None,
    ) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.routes = frozenset(routes)
        self.metrics = metrics
        self.access = access
        self.body_limits = body_limits
        self.in_flight = 0
        self.reading = 0  # bodies being read: a count of their own
        self.max_reading = READING_PER_SLOT * max_in_flight
        # Built once: a refusal costs no serialization. DeepL's clients show ``message``.
        message = (
            f"the service is overloaded: {max_in_flight} translation requests are "
            f"in progress (MT_MAX_INFLIGHT_REQUESTS); retry after {retry_after_s} s"
        )
        self._message, self._retry_after = message, str(retry_after_s)
        self._body = json.dumps({"error": message, "code": "overloaded"}).encode()
        self._deepl_body = json.dumps(
            {"error": message, "code": "overloaded", "message": message}
        ).encode()
        self._headers, self._deepl_headers = (
            [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(retry_after_s).encode()),
            ]
            for body in (self._body, self._deepl_body)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] not in self.routes
            or not (scope["method"] == "POST" or scope["path"] in QUERY_TRANSLATION_ROUTES)
        ):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight or self.reading >= self.max_reading:
            await self._refuse(scope, send)
            return
        if self.access is not None:
            headers = dict(scope.get("headers") or [])
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            refusal = self.access.refusal_from_headers(scope["path"], authorization)
            if refusal is not None:
                await self._answer(scope, receive, send, refusal)
                return
        if self.body_limits is not None and not self._declared_too_large(scope):
            self.reading += 1
            try:
                body, fits = await read_body(receive, self.body_limits)
            except SlowBody:
                message = (
                    f"the request body arrived too slowly (MT_BODY_READ_TIMEOUT_S="
                    f"{self.body_limits.timeout_s:g}, MT_BODY_MIN_BYTES_PER_S="
                    f"{self.body_limits.min_bytes_per_s})"
                )
                error = ApiError(408, "body_timeout", message, {"Connection": "close"})
                await self._answer(scope, receive, send, error)
                return
            except ConnectionError:
                return  # nobody to answer
            finally:
                self.reading -= 1
            if not fits:
                message = f"request body is larger than MT_MAX_BODY_BYTES={self.body_limits.max_bytes} bytes"
                error = ApiError(413, "body_too_large", message, {"Connection": "close"})
                await self._answer(scope, receive, send, error)
                return
            receive = replaying(body, receive)
            if self.in_flight >= self.max_in_flight:  # filled while this body arrived
                await self._refuse(scope, send)
                return
        self.in_flight += 1
        self.metrics.inflight_requests.set(self.in_flight)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.metrics.inflight_requests.set(self.in_flight)

    def _declared_too_large(self, scope: Scope) -> bool:
        """A Content-Length over the limit: the body size limit inside answers 413 unread."""
        assert self.body_limits is not None
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        return declared.isdigit() and int(declared) > self.body_limits.max_bytes

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if scope["path"].startswith(GOOGLE_PREFIX):  # its own shape, built when it happens
            error = ApiError(429, "overloaded", self._message, {"Retry-After": self._retry_after})
            await self._answer(scope, _no_body, send, error)
            return
        self.metrics.rejections.labels(reason="overloaded").inc()
        deepl = scope["path"].startswith("/v2/")
        headers = self._deepl_headers if deepl else self._headers
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        body = self._deepl_body if deepl else self._body
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope, receive: Receive, send: Send, error: ApiError) -> None:
        self.metrics.rejections.labels(reason=error.code).inc()
        body = error_body(scope["path"], error.status, error.code, error.message)
        response = ErrorJSONResponse(body, status_code=error.status, headers=error.headers)
        await response(scope, receive, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}
