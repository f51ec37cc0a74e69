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
from pydantic import BaseModel, ValidationError

from service.config import Settings
from service.text.bulk import translate_in_chunks
from service.text.glossary import Glossary
from service.text.html import translate_html
from service.text.pipeline import DecodingOptions, TextTranslation, TranslationBatch
from service.translation.dispatch import Dispatcher, DispatchResult
from service.translation.languages import language_name
from service.translation.memories import PAIR_DEFAULT, MemoryChoice
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
from service.web.errors import ERROR_RESPONSES, ApiError, describe_validation
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
    access.admit(request, body.api_key, chars=sum(map(len, texts)))
    dispatcher = service.require_dispatcher()
    alternatives = _alternatives(body.alternatives, service.settings)
    options = service.limits.options(None, None)
    others: list[list[str]] = [[] for _ in texts]
    if body.format == "html":
        work = _translate_html(dispatcher, texts, body.source, body.target, options)
        result, translated = await run_for_client(request, service, work)
    else:
        if alternatives:
            # The n-best needs a beam of at least alternatives + 1 (LibreTranslate: hypotheses).
            options = replace(options, beam_size=max(options.beam_size, alternatives + 1))
            n_best = dispatcher.translate_with_alternatives(
                texts, body.source, body.target, options, alternatives
            )
            result, others = await run_for_client(request, service, n_best)
        else:
            plain = dispatcher.translate(texts, body.source, body.target, options)
            result = await run_for_client(request, service, plain)
        translated = [t.text for t in result.batch.translations]
    response.headers[MODELS_HEADER] = ",".join(result.route.legs)
    detected = None
    if result.detections:
        top = result.detections[0]
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


async def _translate_html(
    dispatcher: Dispatcher,
    texts: list[str],
    source: str | None,
    target: str | None,
    options: DecodingOptions,
    glossary: Glossary | None = None,
    memory: MemoryChoice = PAIR_DEFAULT,
) -> tuple[DispatchResult, list[str]]:
    """Each text is an HTML fragment: its units (service/text/html.py) go to the models in
    request-sized chunks (a fragment's many text nodes do not count as many texts), all with
    the route chosen once for the request (``auto`` detects on the fragments as sent)."""
    route, detections = await dispatcher.plan(texts, source, target, glossary, memory)
    chunk_size = dispatcher.limits.max_texts_per_request
    batches: list[TranslationBatch] = []

    async def translate_chunk(units: list[str]) -> list[str]:
        result = await dispatcher.translate(
            units, route.source, route.target, options, glossary, memory=memory
        )
        batches.append(result.batch)
        return [t.text for t in result.batch.translations]

    async def translate_units(units: list[str]) -> list[str]:
        return await translate_in_chunks(units, chunk_size, translate_chunk)

    translated = [await translate_html(text, translate_units) for text in texts]
    return DispatchResult(_merged(batches, translated), route, detections), translated


def _merged(batches: list[TranslationBatch], texts: list[str]) -> TranslationBatch:
    """One batch for the whole request: its texts, the chunks' counts added up."""
    return TranslationBatch(
        translations=[TextTranslation(text, 0, 0) for text in texts],
        input_tokens=sum(b.input_tokens for b in batches),
        output_tokens=sum(b.output_tokens for b in batches),
        decoded_sentences=sum(b.decoded_sentences for b in batches),
        cached_sentences=sum(b.cached_sentences for b in batches),
        memory_sentences=sum(b.memory_sentences for b in batches),
    )


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
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ApiError(
            400, "invalid_request", f"Invalid request: {describe_validation(error.errors())}"
        ) from error


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
