"""Admission control: decide whether to take a translation request on *before* any work is
done for it.

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
"""

from __future__ import annotations

import json
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from service.metrics import ServiceMetrics

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
    }
)


class AdmissionGate:
    """429 at once for translation requests beyond ``max_in_flight`` concurrent ones."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        retry_after_s: int,
        metrics: ServiceMetrics,
        routes: Collection[str] = TRANSLATION_ROUTES,
    ) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.routes = frozenset(routes)
        self.metrics = metrics
        self.in_flight = 0
        # Built once: a refusal costs no serialization. DeepL's clients show ``message``.
        message = (
            f"the service is overloaded: {max_in_flight} translation requests are "
            f"in progress (MT_MAX_INFLIGHT_REQUESTS); retry after {retry_after_s} s"
        )
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
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.routes:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            self.metrics.rejections.labels(reason="overloaded").inc()
            deepl = scope["path"].startswith("/v2/")
            headers = self._deepl_headers if deepl else self._headers
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            body = self._deepl_body if deepl else self._body
            await send({"type": "http.response.body", "body": body})
            return
        self.in_flight += 1
        self.metrics.inflight_requests.set(self.in_flight)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.metrics.inflight_requests.set(self.in_flight)
