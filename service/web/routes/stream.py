"""``POST /v1/translate/stream``: the body of ``POST /v1/translate``, answered as server-sent
events (``text/event-stream``, written by sse-starlette) while the sentences decode.

Events, in this order::

    event: sentence   data: {"text": 0, "index": 2, "sentences": 5, "translation": "…", "tokens": 7}
    …                 one per sentence, as soon as it finishes (not in text order)
    event: done       data: the whole TranslateResponse (translations, model, usage, time_ms)
    data: [DONE]

Whatever can refuse the request (validation, limits, queue full, not ready) is refused before
the stream starts, as a plain JSON error with its status. A failure after the start (timeout,
engine failure, shutdown) arrives as ``event: error`` with ``{"error", "code", "status"}`` and
ends the stream without ``[DONE]``. A client that hangs up has its unfinished rows dropped
from the batch at once (``mt_rejections{reason="client_disconnected"}`` counts it).
A pivot route (X→en→Y) sends no sentence events, only ``done``: its two legs run text by
text. Partial output of a sentence while it decodes is not sent: the engine hands back a row's
tokens when it finishes, and sending per-step tokens would cost a host transfer per step.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from service.translation.dispatch import DispatchStream
from service.translation.outputs import SentenceDone
from service.translation.request import Output
from service.web.deps import Access, Service, run_for_client
from service.web.errors import ERROR_RESPONSES
from service.web.lifecycle import ServiceState
from service.web.routes.v1 import MODELS_HEADER, admit, translate_response
from service.web.schemas import TranslateRequest

router = APIRouter()
PING_S = 15  # a comment line now and then keeps proxies from closing a quiet stream


@router.post(
    "/v1/translate/stream",
    response_class=EventSourceResponse,
    summary="Translate, streaming each sentence as it finishes (server-sent events)",
    responses={
        **ERROR_RESPONSES,
        200: {"content": {"text/event-stream": {}}, "description": "The events."},
    },
)
async def translate_stream(
    body: TranslateRequest, request: Request, service: Service, access: Access
) -> EventSourceResponse:
    started = time.perf_counter()
    dispatcher, translation = admit(body, request, service, access, Output.STREAM)
    stream = await run_for_client(request, service, dispatcher.translate(translation))
    headers = {MODELS_HEADER: ",".join(stream.plan.models)}
    # The events close the stream when they end; the background task closes it too when the
    # client hung up before the first event (the event generator then never ran).
    return EventSourceResponse(
        _events(stream, service, started),
        ping=PING_S,
        headers=headers,
        background=BackgroundTask(stream.aclose),
    )


async def _events(
    stream: DispatchStream, service: ServiceState, started: float
) -> AsyncIterator[dict[str, str]]:
    try:
        async with aclosing(stream):
            async for item in stream:
                if isinstance(item, SentenceDone):
                    data = json.dumps(asdict(item), ensure_ascii=False)
                    yield {"event": "sentence", "data": data}
                    continue
                yield {
                    "event": "done",
                    "data": translate_response(item, started).model_dump_json(),
                }
        yield {"data": "[DONE]"}
    except asyncio.CancelledError:
        # The client hung up (sse-starlette cancels us): closing the stream dropped the rows.
        service.metrics.rejections.labels(reason="client_disconnected").inc()
        raise
    except Exception as error:
        info = service.describe_error(error)
        service.metrics.rejections.labels(reason=info.code).inc()
        payload = {"error": info.message, "code": info.code, "status": info.status}
        yield {"event": "error", "data": json.dumps(payload, ensure_ascii=False)}
