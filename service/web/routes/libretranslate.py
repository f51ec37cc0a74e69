"""LibreTranslate's API: ``POST /translate`` (``format`` text or html, ``alternatives`` from the
beam's n-best), ``POST /detect`` (JSON or form fields), ``GET /languages`` and ``GET /spec``
(the API document), so existing LibreTranslate clients work unchanged. Files: service/web/routes/files.py; ``/frontend/settings``:
service/web/routes/page.py.

Shapes follow LibreTranslate (libretranslate/app.py): ``detectedLanguage`` is
``{"confidence", "language"}`` for one text and the same detection repeated per text for a
list (one detection per request, as LibreTranslate does); ``/detect`` answers the candidates,
best first; ``/languages`` lists every language with the targets reachable from it (directly
or through the pivot language).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from service.config import Settings
from service.translation.dispatch import collect
from service.translation.languages import LanguagePair, language_name
from service.translation.request import Output, TranslationRequest
from service.translation.routing import targets_by_source
from service.web.deps import (
    FORM_TYPES,
    Access,
    Service,
    json_body,
    request_body,
    run_for_client,
    sends_form,
)
from service.web.errors import ERROR_RESPONSES, ApiError, validated
from service.web.routes.memories import memory_choice
from service.web.routes.v1 import MODELS_HEADER
from service.web.schemas import (
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
    openapi_extra=request_body(_BODY_SCHEMA, "application/json", *FORM_TYPES),
)
async def translate(
    request: Request, response: Response, service: Service, access: Access
) -> LibreTranslateResponse:
    body = await read_body(request, LibreTranslateRequest)
    texts = [body.q] if isinstance(body.q, str) else body.q
    owner = access.admit(request, body.api_key, chars=sum(map(len, texts)))
    dispatcher = service.require_dispatcher()
    alternatives = _alternatives(body.alternatives, service.settings)
    options = service.limits.options(None, None)
    n_best = alternatives if body.format == "text" else 0  # html gets [], as LibreTranslate
    if n_best:
        # The n-best needs a beam of at least alternatives + 1 (LibreTranslate: hypotheses).
        options = replace(options, beam_size=max(options.beam_size, n_best + 1))
    translation = TranslationRequest(
        texts,
        LanguagePair.parse(body.source, body.target),
        options,
        format=body.format,
        output=Output.ALTERNATIVES if n_best else Output.WHOLE,
        alternatives=n_best,
        memory=memory_choice(owner),
    )
    result = await run_for_client(request, service, collect(dispatcher.translate(translation)))
    translated = [t.text for t in result.batch.translations]
    others = [list(t.alternatives) for t in result.batch.translations]
    response.headers[MODELS_HEADER] = ",".join(result.plan.route.legs)
    detected = None
    if result.plan.detections:
        top = result.plan.detections[0]
        one = DetectedLanguage(language=top.language, confidence=top.confidence)
        detected = one if isinstance(body.q, str) else [one] * len(texts)
    return LibreTranslateResponse(
        translatedText=translated[0] if isinstance(body.q, str) else translated,
        detectedLanguage=detected,
        alternatives=(others[0] if isinstance(body.q, str) else others) if alternatives else None,
    )


def _alternatives(value: int | str, settings: Settings) -> int:
    """The ``alternatives`` parameter, checked as LibreTranslate does (same texts). The limit
    is MT_ALTERNATIVES_LIMIT, and never more than the largest beam allows."""
    try:
        count = max(0, int(value))
    except ValueError:
        raise ApiError(
            400, "invalid_request", "Invalid request: alternatives parameter is not a number"
        ) from None
    limit = min(settings.access.alternatives_limit, settings.limits.max_beam_size - 1)
    if count > limit:
        raise ApiError(
            400, "invalid_request", f"Invalid request: alternatives parameter must be <= {limit}"
        )
    return count


@router.post(
    "/detect",
    response_model=list[DetectedLanguage],
    responses={**ERROR_RESPONSES},
    summary="Detect the language of a text (LibreTranslate), among the served languages",
    openapi_extra=request_body(_DETECT_SCHEMA, "application/json", *FORM_TYPES),
)
async def detect(request: Request, service: Service, access: Access) -> list[DetectedLanguage]:
    body = await read_body(request, DetectRequest)
    texts = [body.q] if isinstance(body.q, str) else body.q
    access.admit(request, body.api_key, chars=sum(map(len, texts)))
    dispatcher = service.require_dispatcher()
    detections = await dispatcher.detect(body.q)
    return [DetectedLanguage(language=d.language, confidence=d.confidence) for d in detections]


async def read_body(request: Request, model: type[Body]) -> Body:
    """LibreTranslate clients send JSON or form fields; both end up in one model."""
    data: Any
    if sends_form(request):
        form = await request.form()
        data = {key: form.get(key) for key in form}
        if len(questions := form.getlist("q")) > 1:
            data["q"] = questions  # q repeated: a list of texts
    else:
        data = await json_body(request)
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "Invalid request: the body must be a JSON object")
    if not data.get("q"):
        # LibreTranslate's test (``if not q``: absent, "" and [] alike) and words: its clients
        # show them. An empty text has no language to detect and nothing to translate.
        raise ApiError(400, "invalid_request", "Invalid request: missing q parameter")
    return validated(model, data, "Invalid request")


@router.get("/languages", response_model=list[Language], summary="Languages (LibreTranslate)")
async def languages(service: Service) -> list[Language]:
    if service.registry is None:
        return []
    reachable = targets_by_source(service.registry.by_pair, service.settings.model.pivot_lang)
    return [
        Language(code=code, name=language_name(code), targets=targets)
        for code, targets in reachable.items()
    ]


@router.get("/spec", include_in_schema=False)
async def spec(request: Request) -> JSONResponse:
    """LibreTranslate serves its API document at ``/spec`` (GET only; its Swagger UI and some
    clients read it there). Ours is the OpenAPI document of this service, the one at
    ``/openapi.json``: it describes the routes this server answers, LibreTranslate's among
    them. Not rate limited or keyed, as in LibreTranslate (``@limiter.exempt``)."""
    return JSONResponse(request.app.openapi())
