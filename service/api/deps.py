"""What routes share: the service state as a dependency, and awaiting the batcher with the
client's connection watched and the batcher's refusals turned into HTTP errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from service.api.access import AccessPolicy
from service.api.errors import ApiError
from service.api.lifecycle import ServiceState
from service.batcher import EngineFailure, InvalidRow, NotAccepting, QueueFull

T = TypeVar("T")


# Both dependencies are ``async``: FastAPI runs a plain ``def`` dependency in its thread pool,
# a thread hop per request for a dictionary lookup (no speed-up measured at 119 req/s).
async def get_service(request: Request) -> ServiceState:
    return request.app.state.service


Service = Annotated[ServiceState, Depends(get_service)]


async def get_access(request: Request) -> AccessPolicy:
    return request.app.state.access


Access = Annotated[AccessPolicy, Depends(get_access)]


async def run_for_client(request: Request, service: ServiceState, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client hangs up first (then it is cancelled, which drops
    its rows from the batch); turn the batcher's refusals into HTTP errors."""
    settings = service.settings
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=settings.disconnect_poll_s)
            if done:
                break
            if await request.is_disconnected():
                task.cancel()
                raise ApiError(499, "client_disconnected", "the client closed the connection")
        try:
            return task.result()
        except QueueFull as error:
            raise ApiError(429, "queue_full", str(error), service.retry_after()) from error
        except NotAccepting as error:
            raise ApiError(503, error.reason, str(error), service.retry_after()) from error
        except TimeoutError as error:
            raise ApiError(
                504,
                "timeout",
                f"translation took longer than MT_REQUEST_TIMEOUT_S="
                f"{settings.request_timeout_s:g} s; its sentences were dropped",
            ) from error
        except InvalidRow as error:
            raise ApiError(422, "invalid_sentence", str(error)) from error
        except EngineFailure as error:
            raise ApiError(500, "engine_failure", str(error)) from error
    finally:
        if not task.done():
            task.cancel()
