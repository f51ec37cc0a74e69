"""LibreTranslate's API: ``POST /translate`` and ``POST /detect`` (JSON or form fields) and
``GET /languages``, so existing LibreTranslate clients work unchanged.

Shapes follow LibreTranslate (libretranslate/app.py): ``detectedLanguage`` is
``{"confidence", "language"}`` for one text and the same detection repeated per text for a
list (one detection per request, as LibreTranslate does); ``/detect`` answers the candidates,
best first; ``/languages`` lists every language with the targets reachable from it (directly
or through the pivot language).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ValidationError

from service.api.deps import Service, run_for_client
from service.api.errors import ERROR_RESPONSES, ApiError, describe
from service.api.v1 import MODELS_HEADER
from service.languages import language_name
from service.routing import targets_by_source
from service.schemas import (
    DetectedLanguage,
    DetectRequest,
    Language,
    LibreTranslateRequest,
    LibreTranslateResponse,
)

router = APIRouter()
Body = TypeVar("Body", bound=BaseModel)

_BODY_SCHEMA = LibreTranslateRequest.model_json_schema()
_DETECT_SCHEMA = DetectRequest.model_json_schema()


@router.post(
    "/translate",
    response_model=LibreTranslateResponse,
    response_model_exclude_none=True,
    responses={**ERROR_RESPONSES},
    summary="LibreTranslate-compatible translation (JSON or form body)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _BODY_SCHEMA},
                "application/x-www-form-urlencoded": {"schema": _BODY_SCHEMA},
                "multipart/form-data": {"schema": _BODY_SCHEMA},
            },
        }
    },
)
async def translate(
    request: Request, response: Response, service: Service
) -> LibreTranslateResponse:
    body = await read_body(request, LibreTranslateRequest)
    dispatcher = service.require_dispatcher()
    texts = [body.q] if isinstance(body.q, str) else body.q
    options = dispatcher.options(None, None)
    work = dispatcher.translate(texts, body.source, body.target, options)
    result = await run_for_client(request, service, work)
    response.headers[MODELS_HEADER] = ",".join(result.route.legs)
    translated = [t.text for t in result.batch.translations]
    detected = None
    if result.detections:
        top = result.detections[0]
        one = DetectedLanguage(language=top.language, confidence=top.confidence)
        detected = one if isinstance(body.q, str) else [one] * len(texts)
    return LibreTranslateResponse(
        translatedText=translated[0] if isinstance(body.q, str) else translated,
        detectedLanguage=detected,
    )


@router.post(
    "/detect",
    response_model=list[DetectedLanguage],
    responses={**ERROR_RESPONSES},
    summary="Detect the language of a text (LibreTranslate), among the served languages",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _DETECT_SCHEMA},
                "application/x-www-form-urlencoded": {"schema": _DETECT_SCHEMA},
                "multipart/form-data": {"schema": _DETECT_SCHEMA},
            },
        }
    },
)
async def detect(request: Request, service: Service) -> list[DetectedLanguage]:
    body = await read_body(request, DetectRequest)
    dispatcher = service.require_dispatcher()
    detections = await dispatcher.detect(body.q)
    return [DetectedLanguage(language=d.language, confidence=d.confidence) for d in detections]


async def read_body(request: Request, model: type[Body]) -> Body:
    """LibreTranslate clients send JSON or form fields; both end up in one model."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    data: Any
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        data = {key: form.get(key) for key in form}
        if len(questions := form.getlist("q")) > 1:
            data["q"] = questions  # q repeated: a list of texts
    else:
        raw = await request.body()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as error:
            raise ApiError(400, "malformed_json", f"malformed JSON body: {error}") from error
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "Invalid request: the body must be a JSON object")
    if data.get("q") is None:
        # LibreTranslate's words: its clients show them.
        raise ApiError(400, "invalid_request", "Invalid request: missing q parameter")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ApiError(
            400, "invalid_request", f"Invalid request: {describe(error.errors())}"
        ) from error


@router.get("/languages", response_model=list[Language], summary="Languages (LibreTranslate)")
async def languages(service: Service) -> list[Language]:
    if service.registry is None:
        return []
    reachable = targets_by_source(service.registry.by_pair, service.settings.pivot_lang)
    return [
        Language(code=code, name=language_name(code), targets=targets)
        for code, targets in reachable.items()
    ]
