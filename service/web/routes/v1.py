"""The service's own API: ``POST /v1/translate`` and ``GET /v1/models``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from service.text.plans import TextTranslation
from service.translation.detection import Detection
from service.translation.dispatch import Dispatcher, DispatchResult, collect
from service.translation.languages import LanguagePair
from service.translation.planning import RoutePlan
from service.translation.request import Output, Routing, TranslationRequest
from service.web.access import AccessPolicy
from service.web.deps import Access, Service, run_for_client
from service.web.errors import ERROR_RESPONSES
from service.web.lifecycle import ServiceState
from service.web.routes.glossaries import request_glossary
from service.web.routes.memories import memory_choice
from service.web.schemas import (
    DetectedLanguage,
    ModelCard,
    ModelList,
    TranslateRequest,
    TranslateResponse,
    Translation,
    Usage,
)

router = APIRouter()
MODELS_HEADER = "X-Translation-Models"  # which models ran, on both translation APIs
# With a detected source: each text's detected language and its confidence (0–100), in input
# order, comma-separated. A client that reads only headers (or streams) can still see that a
# short text was a close call and send it again with its source_lang.
DETECTED_HEADER = "X-Detected-Language"
CONFIDENCE_HEADER = "X-Detected-Language-Confidence"


@router.post(
    "/v1/translate",
    response_model=TranslateResponse,
    responses=ERROR_RESPONSES,
    summary="Translate one text or a list of texts",
)
async def translate(
    body: TranslateRequest,
    request: Request,
    response: Response,
    service: Service,
    access: Access,
) -> TranslateResponse:
    started = time.perf_counter()
    dispatcher, translation = admit(body, request, service, access, Output.WHOLE)
    work = collect(dispatcher.translate(translation))
    result = await run_for_client(request, service, work)
    response.headers[MODELS_HEADER] = ",".join(result.plan.models)
    response.headers.update(detection_headers(result.plan, len(translation.texts)))
    return translate_response(result, started)


def detection_headers(plan: RoutePlan, count: int) -> dict[str, str]:
    """DETECTED_HEADER and CONFIDENCE_HEADER for a detected source (none otherwise)."""
    detections = [plan.detection_of(index) for index in range(count)]
    if not detections or any(d is None for d in detections):
        return {}
    return {
        DETECTED_HEADER: ",".join(d.language for d in detections if d is not None),
        CONFIDENCE_HEADER: ",".join(f"{d.confidence:g}" for d in detections if d is not None),
    }


def admit(
    body: TranslateRequest,
    request: Request,
    service: ServiceState,
    access: AccessPolicy,
    output: Output,
) -> tuple[Dispatcher, TranslationRequest]:
    """What both ``/v1`` translation routes do before any work: charge the client, check the
    service is ready, fill in and check the decoding options, the glossary and the memory.
    Each text is detected and routed on its own."""
    texts = [body.text] if isinstance(body.text, str) else body.text
    owner = access.admit(request, None, chars=sum(map(len, texts)))
    dispatcher = service.require_dispatcher()
    translation = TranslationRequest(
        texts,
        LanguagePair.parse(body.source_lang, body.target_lang),
        service.limits.options(body.beam_size, body.max_new_tokens),
        output=output,
        glossary=request_glossary(service, owner, body.glossary, body.glossary_id),
        memory=memory_choice(owner, body.memory_id, body.use_memory),
        routing=Routing.EACH_TEXT,
    )
    return dispatcher, translation


def translate_response(result: DispatchResult, started: float) -> TranslateResponse:
    """The ``/v1/translate`` body for ``result`` (also the streaming API's last event)."""
    batch, plan = result.batch, result.plan
    route, detected = plan.route, plan.detections[0] if plan.detections else None
    return TranslateResponse(
        translations=[_translation(plan, index, t) for index, t in enumerate(batch.translations)],
        model="+".join(plan.models),
        models=plan.models,
        source_lang=route.shown_source,
        target_lang=route.shown_target,
        detected_language=_detected(detected),
        usage=Usage(
            input_tokens=batch.input_tokens,
            output_tokens=batch.output_tokens,
            sentences=batch.decoded_sentences,
            cached_sentences=batch.cached_sentences,
            memory_sentences=batch.memory_sentences,
        ),
        time_ms=round((time.perf_counter() - started) * 1000, 3),
    )


def _translation(plan: RoutePlan, index: int, text: TextTranslation) -> Translation:
    """One text's translation with its own source and models (both legs of a pivot), and
    its detection when detected."""
    route = plan.route_of(index)
    return Translation(
        text=text.text,
        tokens=text.output_tokens,
        sentences=text.sentences,
        source_lang=route.shown_source,
        models=list(route.legs),
        detected_language=_detected(plan.detection_of(index)),
        unchanged=not route.legs,
    )


def _detected(detected: Detection | None) -> DetectedLanguage | None:
    if detected is None:
        return None
    return DetectedLanguage(language=detected.language, confidence=detected.confidence)


@router.get("/v1/models", response_model=ModelList, summary="The models this process serves")
async def models(service: Service) -> ModelList:
    if service.registry is None:
        return ModelList(data=[])
    return ModelList(
        data=[
            ModelCard(
                id=slot.spec.model_id,
                source_lang=slot.spec.source_lang,
                target_lang=slot.spec.target_lang,
                languages=list(slot.spec.languages),
                provider=slot.provider,
                state=slot.state,
                ready=slot.state == "loaded",
                weights_bytes=slot.weights_bytes,
                memory_bytes=slot.memory_bytes,
                revision=slot.revision,
            )
            for slot in service.registry.slots.values()
        ]
    )
