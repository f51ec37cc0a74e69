"""Operations: ``/health`` (process alive), ``/ready`` (model loaded and warmed up, and the
shared database reachable) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.web.access import check_metrics_token
from service.web.deps import Service
from service.web.schemas import Status

router = APIRouter()


@router.get("/health", response_model=Status, summary="Process alive (503 if the model failed)")
async def health(service: Service) -> Response:
    if service.refresh_phase() == "failed":
        return JSONResponse({"status": "failed", "detail": service.detail}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready", response_model=Status, summary="Model loaded and warmed up")
async def ready(service: Service) -> Response:
    if service.refresh_phase() == "ready":
        # Off the event loop: an unreachable database may take its connect timeout to say so.
        if (reason := await asyncio.to_thread(service.store_unreachable)) is None:
            return JSONResponse({"status": "ready"})
        return JSONResponse(
            {"status": "store_unavailable", "detail": reason},
            status_code=503,
            headers=service.retry_after(),
        )
    return JSONResponse(
        {"status": service.phase, "detail": service.detail},
        status_code=503,
        headers=service.retry_after(),
    )


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request, service: Service) -> Response:
    if service.settings.access.metrics_token:
        check_metrics_token(request, service.settings.access.metrics_token)
    slots = service.registry.slots.items() if service.registry is not None else ()
    engines = {model_id: slot.model.batcher.alive for model_id, slot in slots if slot.model}
    service.metrics.on_health(service.refresh_phase(), engines)
    return Response(service.metrics.render(), media_type=service.metrics.content_type)
