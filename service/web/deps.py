"""What routes share: the service state, the access policy and the admitted owner of a
stored item's route as dependencies, and awaiting the batcher with the client's connection
watched."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request

from service.storage.owners import Owner
from service.web.access import AccessPolicy
from service.web.errors import ApiError
from service.web.lifecycle import ServiceState

T = TypeVar("T")


# Both dependencies are ``async``: FastAPI runs a plain ``def`` dependency in its thread pool,
# a thread hop per request for a dictionary lookup.
async def get_service(request: Request) -> ServiceState:
    return request.app.state.service


Service = Annotated[ServiceState, Depends(get_service)]


async def get_access(request: Request) -> AccessPolicy:
    return request.app.state.access


Access = Annotated[AccessPolicy, Depends(get_access)]


async def get_current_owner(request: Request, access: Access) -> Owner:
    """The owner of a request that manages stored items (glossaries, memories, document
    jobs): admitted as one request of no characters (401, 403 or 429 as
    ``AccessPolicy.admit``), and seeing what its key owns and what is shared."""
    return access.admit(request, None, chars=0)


CurrentOwner = Annotated[Owner, Depends(get_current_owner)]


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def request_body(schema: dict[str, Any], *content_types: str) -> dict[str, Any]:
    """The OpenAPI request body (``openapi_extra``) of a route that reads its body by hand:
    ``schema`` under each content type, so clients (and the fuzz tests) see what it holds."""
    content = {content_type: {"schema": schema} for content_type in content_types}
    return {"requestBody": {"required": True, "content": content}}


def upload_body(required: list[str], fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``request_body`` of a multipart upload: a binary ``file`` and the named text
    ``fields`` (``required`` besides the file)."""
    properties = {"file": {"type": "string", "format": "binary"}, **fields}
    schema = {"type": "object", "required": ["file", *required], "properties": properties}
    return request_body(schema, "multipart/form-data")


def sends_form(request: Request) -> bool:
    """Whether the body is form fields (the compatibility APIs take form or JSON)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return content_type in FORM_TYPES


async def json_body(request: Request) -> Any:
    """The body parsed as JSON (an empty body is ``{}``); 400 ``malformed_json`` otherwise,
    and 400 ``invalid_unicode`` for a string that holds an unpaired surrogate escape
    (``"\\ud800"``): no character, it cannot be stored or written back as UTF-8, and the
    routes that read this body by hand would otherwise fail while answering."""
    raw = await request.body()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError as error:
        raise ApiError(400, "malformed_json", f"malformed JSON body: {error}") from error
    except RecursionError as error:
        raise ApiError(400, "malformed_json", "malformed JSON body: nested too deeply") from error
    if _may_hold_surrogates(raw):
        _check_unicode(data)
    return data


def _may_hold_surrogates(raw: bytes) -> bool:
    """Whether ``json.loads(raw)`` can hold an unpaired surrogate. It decodes UTF-8 with
    ``surrogatepass`` (an encoded surrogate comes through) and other encodings it detects
    as they are, and a ``\\u`` escape can name one: a UTF-8 body that decodes strictly and
    has no escape holds none, and its values need no walk."""
    if b"\\u" in raw or json.detect_encoding(raw) != "utf-8":
        return True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _check_unicode(data: Any) -> None:
    """400 naming the first string (value or key) that is not valid Unicode; iterative, so
    a deeply nested body costs no recursion."""
    pending = [("", data)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((str(key), key) for key in value)
            pending.extend((str(key), item) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((where, item) for item in value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                field = f"in {where[:40]!a}: " if where else ""
                raise ApiError(
                    400,
                    "invalid_unicode",
                    f"{field}unpaired UTF-16 surrogate U+{ord(value[error.start]):04X} at index "
                    f"{error.start}; send valid Unicode",
                ) from None


# A route whose body is still unread (it would read it while its work runs) keeps a poll:
# waiting on ``receive()`` there would take the body's messages from the route.
UNREAD_BODY_POLL_S = 0.25


async def run_for_client(request: Request, service: ServiceState, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client hangs up first (then it is cancelled, which drops
    its rows from the batch, and the answer is 499). Refusals propagate as the service's own
    errors, which the error handlers map (service/web/errors.py).

    The hang-up is heard, not polled for: once the body is read, the server's ``receive()``
    blocks until the client goes away (uvicorn, either HTTP implementation, then says
    ``http.disconnect``; so do the test clients once the response is complete), so one
    watcher per request waits on it beside the work, and whichever ends first ends the
    other. The work runs in the request's own task (a task of its own would cost its
    creation and a hand-over on every request): the watcher cancels that task, and the
    cancellation it caused is taken back once it is answered as 499. ``service`` is the
    routes' usual argument; what a route's wait needs is in ``request``."""
    if not _body_read(request):
        return await _polled(request, asyncio.ensure_future(work))
    current = asyncio.current_task()
    assert current is not None
    hung_up = False

    async def watch() -> None:
        nonlocal hung_up
        receive = request.receive
        # Past the body a server sends nothing but the disconnect; a message of the body
        # replayed by a middleware (or a GET's empty one) is passed over, as Starlette's
        # ``StreamingResponse.listen_for_disconnect`` does.
        while (await receive())["type"] != "http.disconnect":
            pass
        hung_up = True
        current.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if hung_up:
            raise ApiError(499, "client_disconnected", "the client closed the connection") from None
        raise
    finally:
        watcher.cancel()
        if hung_up:  # the watcher's cancellation is answered (or was swallowed by the work)
            current.uncancel()


def _body_read(request: Request) -> bool:
    """Whether the route has read its body (FastAPI reads it for a body parameter; the
    compatibility routes read it by hand before their work), so that ``receive()`` has
    nothing left to give but the disconnect. A GET's or HEAD's body is nobody's."""
    return (
        request.method in ("GET", "HEAD")
        or hasattr(request, "_body")  # Starlette's cache of ``body()``
        or request._stream_consumed  # ``stream()`` (and so ``form()``) ran to the end
    )


async def _polled(request: Request, task: asyncio.Future[T]) -> T:
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=UNREAD_BODY_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise ApiError(499, "client_disconnected", "the client closed the connection")
    finally:
        if not task.done():
            task.cancel()
