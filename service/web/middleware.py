"""Two small ASGI middlewares: a body size limit and per-route request metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics
from service.web.errors import error_response


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
            response = error_response(413, "body_too_large", self._message(), None, Request(scope))
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
        # Each (route, status)'s series, looked up once: ``labels()`` takes a lock and
        # checks its arguments on every call. Route templates and statuses are few.
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

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
            # The route template, not the raw path, so label values stay few. Starlette sets
            # scope["route"] only on a match; every route it sets has a ``path``.
            label = route.path if route is not None else "unmatched"
            children = self._children.get((label, status))
            if children is None:
                children = self._children[(label, status)] = (
                    self.metrics.requests.labels(route=label, status=str(status)),
                    self.metrics.request_latency.labels(route=label, status=str(status)),
                )
            children[0].inc()
            children[1].observe(time.perf_counter() - started)
