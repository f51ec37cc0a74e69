"""LibreTranslate's API: ``POST /translate`` (JSON or form fields) and ``GET /languages``,
so existing LibreTranslate clients work unchanged."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from service.api.deps import Service, run_for_client
from service.api.errors import ERROR_RESPONSES, ApiError, describe
from service.languages import language_name
from service.schemas import (
    DetectedLanguage,
    Language,
    LibreTranslateRequest,
    LibreTranslateResponse,
)

router = APIRouter()

_BODY_SCHEMA = LibreTranslateRequest.model_json_schema()


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
async def translate(request: Request, service: Service) -> LibreTranslateResponse:
    body = await read_body(request)
    translator = service.require_translator()
    service.check_languages(body.source, body.target)
    texts = [body.q] if isinstance(body.q, str) else body.q
    options = translator.options(None, None)
    batch = await run_for_client(request, service, translator.translate(texts, options))
    translated = [t.text for t in batch.translations]
    detected = None
    if body.source.lower() == "auto":
        one = DetectedLanguage(language=service.source_lang, confidence=100.0)
        detected = one if isinstance(body.q, str) else [one] * len(texts)
    return LibreTranslateResponse(
        translatedText=translated[0] if isinstance(body.q, str) else translated,
        detectedLanguage=detected,
    )


async def read_body(request: Request) -> LibreTranslateRequest:
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
    try:
        return LibreTranslateRequest.model_validate(data)
    except ValidationError as error:
        raise ApiError(
            400, "invalid_request", f"Invalid request: {describe(error.errors())}"
        ) from error


@router.get("/languages", response_model=list[Language], summary="Languages (LibreTranslate)")
async def languages(service: Service) -> list[Language]:
    source, target = service.source_lang, service.target_lang
    return [
        Language(code=source, name=language_name(source), targets=[target]),
        Language(code=target, name=language_name(target), targets=[]),
    ]
