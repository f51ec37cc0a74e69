"""The service's own API: ``POST /v1/translate`` and ``GET /v1/models``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from service.api.deps import Service, run_for_client
from service.api.errors import ERROR_RESPONSES
from service.schemas import (
    ModelCard,
    ModelList,
    TranslateRequest,
    TranslateResponse,
    Translation,
    Usage,
)

router = APIRouter()


@router.post(
    "/v1/translate",
    response_model=TranslateResponse,
    responses=ERROR_RESPONSES,
    summary="Translate one text or a list of texts",
)
async def translate(
    body: TranslateRequest, request: Request, service: Service
) -> TranslateResponse:
    started = time.perf_counter()
    translator = service.require_translator()
    service.check_languages(body.source_lang, body.target_lang)
    texts = [body.text] if isinstance(body.text, str) else body.text
    options = translator.options(body.beam_size, body.max_new_tokens)
    batch = await run_for_client(request, service, translator.translate(texts, options))
    return TranslateResponse(
        translations=[
            Translation(text=t.text, tokens=t.output_tokens, sentences=t.sentences)
            for t in batch.translations
        ],
        model=service.model_name,
        source_lang=service.source_lang,
        target_lang=service.target_lang,
        usage=Usage(
            input_tokens=batch.input_tokens,
            output_tokens=batch.output_tokens,
            sentences=batch.decoded_sentences,
            cached_sentences=batch.cached_sentences,
        ),
        time_ms=round((time.perf_counter() - started) * 1000, 3),
    )


@router.get("/v1/models", response_model=ModelList, summary="The model this process serves")
async def models(service: Service) -> ModelList:
    return ModelList(
        data=[
            ModelCard(
                id=service.model_name,
                source_lang=service.source_lang,
                target_lang=service.target_lang,
                provider=service.provider,
                ready=service.phase == "ready",
            )
        ]
    )
