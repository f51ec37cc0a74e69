"""The service's own API: ``POST /v1/translate`` and ``GET /v1/models``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from service.text.glossary import Glossary
from service.text.pipeline import DecodingOptions, TextTranslation
from service.translation.detection import Detection
from service.translation.dispatch import Dispatcher, DispatchResult
from service.translation.memories import MemoryChoice
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
    texts, dispatcher, options, glossary, memory = admit(body, request, service, access)
    work = dispatcher.translate(
        texts, body.source_lang, body.target_lang, options, glossary, each_text=True, memory=memory
    )
    result = await run_for_client(request, service, work)
    response.headers[MODELS_HEADER] = ",".join(result.models)
    response.headers.update(detection_headers(result, len(texts)))
    return translate_response(result, started)


def detection_headers(result: DispatchResult, count: int) -> dict[str, str]:
    """DETECTED_HEADER and CONFIDENCE_HEADER for a detected source (none otherwise)."""
    detections = [result.detection_of(index) for index in range(count)]
    if not detections or any(d is None for d in detections):
        return {}
    return {
        DETECTED_HEADER: ",".join(d.language for d in detections if d is not None),
        CONFIDENCE_HEADER: ",".join(f"{d.confidence:g}" for d in detections if d is not None),
    }


def admit(
    body: TranslateRequest, request: Request, service: ServiceState, access: AccessPolicy
) -> tuple[list[str], Dispatcher, DecodingOptions, Glossary | None, MemoryChoice]:
    """What both ``/v1`` translation routes do before any work: charge the client, check the
    service is ready, fill in and check the decoding options, the glossary and the memory."""
    texts = [body.text] if isinstance(body.text, str) else body.text
    access.admit(request, None, chars=sum(map(len, texts)))
    dispatcher = service.require_dispatcher()
    options = service.limits.options(body.beam_size, body.max_new_tokens)
    glossary = request_glossary(service, body.glossary, body.glossary_id)
    return texts, dispatcher, options, glossary, memory_choice(body.memory_id, body.use_memory)


def translate_response(result: DispatchResult, started: float) -> TranslateResponse:
    """The ``/v1/translate`` body for ``result`` (also the streaming API's last event)."""
    batch, route = result.batch, result.route
    detected = result.detections[0] if result.detections else None
    return TranslateResponse(
        translations=[_translation(result, index, t) for index, t in enumerate(batch.translations)],
        model="+".join(result.models),
        models=result.models,
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


def _translation(result: DispatchResult, index: int, text: TextTranslation) -> Translation:
    """One text's translation; with its own source, models and detection when detected."""
    translation = Translation(text=text.text, tokens=text.output_tokens, sentences=text.sentences)
    detected = result.detection_of(index)
    if detected is not None:
        route = result.route_of(index)
        translation.source_lang = route.shown_source
        translation.models = list(route.legs)
        translation.detected_language = _detected(detected)
    return translation


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
            )
            for slot in service.registry.slots.values()
        ]
    )
