"""The two translation routes most requests use, ``POST /v1/translate`` and LibreTranslate's
``POST /translate``, run without the framework's per-request machinery around them.

For every request FastAPI and Starlette match the path against the routes, set up two exit
stacks and an exception wrapper, parse the content type with ``email.message``, solve the
routes' dependencies, validate the body, then validate the returned model once more before
serialising it. For a short text that is a visible share of the event loop's time, on the
thread that also tokenizes and hands results back. :class:`DirectRoutes`, the innermost
middleware, calls the same route functions with what FastAPI would have given them: the
body validated as the route declares it, the service and the access policy, a ``Request``
and a ``Response`` for the headers; it serialises the result with the route's own response
field and settings, and maps exceptions with the app's own handlers. So the answer, its
headers and its status are the ones FastAPI gives, byte for byte (tests/web/test_direct.py).

A request that is not the plain case (a form body, another content type, a body that does
not parse or validate) goes on to the app with its body replayed: FastAPI answers it, so
every error shape stays FastAPI's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette._exception_handler import wrap_app_handling_exceptions
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.web.access import AccessPolicy
from service.web.deps import FORM_TYPES
from service.web.lifecycle import ServiceState
from service.web.routes import libretranslate, v1
from service.web.schemas import TranslateRequest

# A route run directly: the body read, the Request and the sub-response the route writes
# headers into; its returned model, or None to leave the request to the app (before any
# work was done for it).
Runner = Callable[
    [bytes, Request, Response, ServiceState, AccessPolicy], Awaitable[BaseModel | None]
]
_FORMS = tuple(form.encode() for form in FORM_TYPES)


def _content_type(scope: Scope) -> bytes:
    """The content type's media type, lower case, without parameters (b"" without one)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bytes(value).split(b";", 1)[0].strip().lower()
    return b""


async def _v1_translate(
    body: bytes, request: Request, response: Response, service: ServiceState, access: AccessPolicy
) -> BaseModel | None:
    # FastAPI parses a JSON body as JSON only for a JSON content type; anything else, and any
    # body that does not validate, is the app's to answer (its 422 shapes).
    if _content_type(request.scope) != b"application/json" or not body:
        return None
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            return None
        model = TranslateRequest.model_validate(data)
    except Exception:  # malformed, nested too deeply, invalid: FastAPI's answer
        return None
    return await v1.translate(model, request, response, service, access)


async def _libretranslate_translate(
    body: bytes, request: Request, response: Response, service: ServiceState, access: AccessPolicy
) -> BaseModel | None:
    # The route reads its body by hand (JSON or form) and raises its own errors; forms (and
    # their uploads, which the app's exit stack closes) stay on the app's path.
    if _content_type(request.scope) in _FORMS:
        return None
    return await libretranslate.translate(request, response, service, access)


RUNNERS: dict[str, Runner] = {
    "/v1/translate": _v1_translate,
    "/translate": _libretranslate_translate,
}


class DirectRoutes:
    """Innermost middleware: ``RUNNERS``' routes answered without the router and FastAPI's
    request handling; everything else passes to the app."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        self._routes: dict[str, tuple[APIRoute, Runner]] | None = None
        # The handlers the app's exception middleware holds (500 is the outer one's).
        handlers = {
            key: handler
            for key, handler in fastapi_app.exception_handlers.items()
            if key not in (500, Exception)
        }
        middleware = ExceptionMiddleware(app, handlers=handlers)
        self._handlers = (middleware._exception_handlers, middleware._status_handlers)

    def _direct_routes(self) -> dict[str, tuple[APIRoute, Runner]]:
        """Each runner's APIRoute, the one the router would pick (looked up at the first
        request, when the routes exist); a route answered through a response class of its
        own is left to FastAPI."""
        if self._routes is None:
            found = _post_routes(self.fastapi_app)
            self._routes = {
                path: (found[path], run)
                for path, run in RUNNERS.items()
                if path in found
                and found[path].response_field is not None
                and isinstance(found[path].response_class, DefaultPlaceholder)
            }
        return self._routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        direct = self._direct_routes().get(scope["path"])
        if direct is None or self.fastapi_app.dependency_overrides:  # overrides: FastAPI's
            await self.app(scope, receive, send)
            return
        route, run = direct
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        scope["starlette.exception_handlers"] = self._handlers
        request = Request(scope, receive, send)
        state = self.fastapi_app.state
        messages: list[Message] = []
        declined = False

        async def respond(scope: Scope, receive: Receive, send: Send) -> None:
            nonlocal declined
            body = await _read(receive, messages)  # inside: a limit's 413 is mapped
            result = None
            if body is not None:
                # Starlette's cache of ``body()``, as FastAPI's read leaves it: the
                # LibreTranslate route reads its body there, and the wait for the work
                # knows that the body is read.
                request._body = body
                sub = Response()
                del sub.headers["content-length"]
                sub.status_code = None  # type: ignore[assignment]
                result = await run(body, request, sub, state.service, state.access)
            if result is None:  # nothing done yet: the app answers
                declined = True
                return
            field = route.response_field
            assert field is not None
            content = field.serialize_json(
                result,
                include=route.response_model_include,
                exclude=route.response_model_exclude,
                by_alias=route.response_model_by_alias,
                exclude_unset=route.response_model_exclude_unset,
                exclude_defaults=route.response_model_exclude_defaults,
                exclude_none=route.response_model_exclude_none,
            )
            response = Response(
                content=content,
                media_type="application/json",
                # FastAPI's order: what the route set, else the declared status, else 200
                status_code=sub.status_code or route.status_code or 200,
            )
            response.headers.raw.extend(sub.headers.raw)
            await response(scope, receive, send)

        # Errors as the route's own wrapper maps them (the app's handlers; others propagate
        # to the outer error middleware, as from the router).
        await wrap_app_handling_exceptions(respond, request)(scope, receive, send)
        if declined:
            del scope["route"], scope["endpoint"], scope["path_params"]
            await self.app(scope, _replay(messages, receive), send)


def _post_routes(app: FastAPI) -> dict[str, APIRoute]:
    """The app's POST routes by path, the first of a path as the router matches them
    (FastAPI keeps an included router's routes behind it, with their effective paths)."""
    found: dict[str, APIRoute] = {}
    for route in app.router.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            candidates = [(context.path, context.original_route) for context in contexts()]
        else:
            candidates = [(getattr(route, "path", ""), route)]
        for path, original in candidates:
            if isinstance(original, APIRoute) and "POST" in (original.methods or ()):
                found.setdefault(path, original)
    return found


async def _read(receive: Receive, messages: list[Message]) -> bytes | None:
    """The body (None if the client left first); ``messages`` gets what was received."""
    chunks = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives ``messages`` again, then what the client sends next."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
