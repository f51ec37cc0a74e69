"""DeepL's API v2, the subset its client libraries use, so code written for DeepL (the official
``deepl`` package with ``server_url``, CAT tools, Weblate) works against this service unchanged:

* ``POST /v2/translate`` (JSON or form): ``text`` (a list), ``source_lang`` (omitted:
  detected), ``target_lang``, ``tag_handling`` (``html``/``xml``: markup-aware, as
  LibreTranslate's ``format=html``), ``glossary_id``, ``translation_memory_id`` (one of
  ``/v1/memories``; without it the pair's default memory, as on every API; only exact
  matches are used, whatever ``translation_memory_threshold`` allows).
  ``formality`` is checked as DeepL checks it: no served target language has formality
  variants (``/v2/languages`` says so), so ``more`` and ``less`` are refused and
  ``default``, ``prefer_more`` and ``prefer_less`` translate as usual. ``context`` (a
  string, not billed) is accepted and has no effect: the models translate sentence by
  sentence, with no context. ``split_sentences``, ``preserve_formatting``, ``ignore_tags``,
  ``splitting_tags``, ``non_splitting_tags`` and ``outline_detection`` do what DeepL's do
  (service/web/routes/deepl_fields.py).
* ``GET /v2/languages?type=source|target``; ``GET /v2/usage``: the calling client's
  characters this month and ``MT_DEEPL_CHARACTER_LIMIT``, past which ``/v2/translate``
  answers DeepL's 456 (service/web/quota.py).
* ``POST /v2/document`` (multipart ``file``, ``target_lang``, ``source_lang``) →
  ``document_id`` and ``document_key``; ``POST /v2/document/{id}`` (status, with
  ``seconds_remaining``) and ``POST /v2/document/{id}/result``, each with the
  ``document_key``: the service's document jobs (service/web/routes/documents.py).
* ``GET /v2/glossary-language-pairs``, ``POST/GET/DELETE /v2/glossaries[/{id}]``,
  ``GET /v2/glossaries/{id}/entries`` (TSV): the same store as ``/v1/glossaries``.

Language codes are DeepL's upper-case ones; a regional variant (``EN-US``, ``PT-BR``) is
served by the model of its language, and the target list names English and Portuguese by
region only (``EN-GB``, ``EN-US``), as DeepL's does. Keys: ``Authorization: DeepL-Auth-Key
KEY`` is one of the service's API keys (service/web/access.py); a missing or unknown key is
403, as DeepL answers. Errors carry DeepL's ``message`` field (service/web/errors.py).
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile

from service.errors import ApiError, NotFound
from service.storage.documents import DocumentJob
from service.storage.glossaries import GlossaryInfo
from service.storage.owners import Owner
from service.text.glossary import entries_tsv, parse_entries
from service.translation.dispatch import collect
from service.translation.languages import LanguagePair, language_name
from service.translation.request import TranslationRequest
from service.translation.routing import source_languages, targets_by_source
from service.web.access import AccessPolicy
from service.web.deps import (
    Access,
    Service,
    request_body,
    run_for_client,
    upload_body,
)
from service.web.lifecycle import ServiceState
from service.web.routes.deepl_fields import (
    CHOICES,
    FORMALITIES,
    TAG_LISTS,
    check_options,
    markup_rules,
    read_fields,
    string_field,
    text_handling,
)
from service.web.routes.documents import owned_job, result_response, submit
from service.web.routes.glossaries import card, create_glossary
from service.web.routes.memories import memory_choice
from service.web.routes.v1 import MODELS_HEADER

router = APIRouter(prefix="/v2")
# DeepL's clients expect a limit; without MT_DEEPL_CHARACTER_LIMIT, one no client will reach.
NO_CHARACTER_LIMIT = 1_000_000_000_000
# DeepL lists these targets by region only (its clients refuse a bare ``EN`` or ``PT``); one
# model of the language serves every region.
TARGET_VARIANTS = {
    "en": (("EN-GB", "English (British)"), ("EN-US", "English (American)")),
    "pt": (("PT-BR", "Portuguese (Brazilian)"), ("PT-PT", "Portuguese (European)")),
}


def deepl_code(code: str) -> str:
    """``EN-US`` → ``en``: the service's code for one of DeepL's."""
    return code.strip().split("-")[0].lower()


def admit(request: Request, access: AccessPolicy, chars: int) -> Owner:
    """The service's keys and limits, with DeepL's status for a missing key (403); whose
    stored items the request sees."""
    try:
        return access.admit(request, None, chars=chars)
    except ApiError as error:
        if error.status == 401:
            raise ApiError(403, "invalid_api_key", "Authorization failure: no key") from error
        raise


async def get_deepl_owner(request: Request, access: Access) -> Owner:
    """``CurrentOwner`` (service/web/deps.py) with DeepL's answer to a missing key."""
    return admit(request, access, chars=0)


DeepLOwner = Annotated[Owner, Depends(get_deepl_owner)]


def _form(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI request body for a route that reads DeepL's form or JSON fields by hand."""
    schema = {"type": "object", "required": required, "properties": properties}
    return request_body(schema, "application/json", "application/x-www-form-urlencoded")


_STRING = {"type": "string"}


@router.post(
    "/translate",
    summary="Translate texts (DeepL API v2)",
    openapi_extra=_form(
        ["text", "target_lang"],
        {
            "text": {"oneOf": [_STRING, {"type": "array", "items": _STRING}]},
            "source_lang": _STRING,
            "target_lang": _STRING,
            "glossary_id": _STRING,
            "tag_handling": {"type": "string", "enum": list(CHOICES["tag_handling"])},
            "formality": {"type": "string", "enum": list(FORMALITIES)},
            "context": _STRING,
            "translation_memory_id": _STRING,
            "split_sentences": {"type": "string", "enum": list(CHOICES["split_sentences"])},
            "preserve_formatting": {"type": "boolean"},
            "outline_detection": {"type": "boolean"},
            **{name: {"type": "array", "items": _STRING} for name in TAG_LISTS},
        },
    ),
)
async def translate(
    request: Request, response: Response, service: Service, access: Access
) -> dict[str, Any]:
    fields = await read_fields(request)
    texts = fields.get("text")
    texts = [texts] if isinstance(texts, str) else texts
    # A JSON body may hold anything there (a number, an object): only strings are texts.
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "invalid_request", "Parameter 'text' not specified")
    characters = sum(map(len, texts))
    owner = admit(request, access, chars=characters)
    identity = access.identity(request)
    service.quota.check(identity, characters)
    target = deepl_code(string_field(fields, "target_lang", required=True) or "")
    source_code = string_field(fields, "source_lang")
    source = deepl_code(source_code) if source_code else None
    check_options(fields)
    glossary_id = string_field(fields, "glossary_id")
    if glossary_id is not None and source is None:
        raise ApiError(400, "invalid_request", "a glossary needs source_lang")  # as DeepL
    glossary = service.glossaries.glossary(glossary_id, owner.key) if glossary_id else None
    memory = memory_choice(owner, string_field(fields, "translation_memory_id"))
    dispatcher = service.require_dispatcher()
    translation = TranslationRequest(
        texts,
        LanguagePair.parse(source, target),
        service.limits.options(None, None),
        format="html" if string_field(fields, "tag_handling") in ("html", "xml") else "text",
        markup=markup_rules(fields),
        handling=text_handling(fields),
        glossary=glossary,
        memory=memory,
    )
    result = await run_for_client(request, service, collect(dispatcher.translate(translation)))
    translated = [t.text for t in result.batch.translations]
    service.quota.record(identity, characters, result.batch.memory_sentences)
    response.headers[MODELS_HEADER] = ",".join(result.plan.route.legs)
    detected = result.plan.route.source.upper()
    return {
        "translations": [
            {"detected_source_language": detected, "text": text, "billed_characters": len(source)}
            for source, text in zip(texts, translated, strict=True)
        ]
    }


@router.get(
    "/languages",
    summary="Source or target languages (DeepL API v2)",
    dependencies=[Depends(get_deepl_owner)],
)
async def languages(request: Request, service: Service) -> list[dict[str, Any]]:
    kind = request.query_params.get("type")
    if kind is None and request.method == "GET":
        # DeepL's client sends ``type`` as a form body, even on GET.
        kind = (await request.form()).get("type")  # type: ignore[assignment]
    pairs = service.registry.by_pair if service.registry is not None else {}
    if kind == "target":
        reachable = targets_by_source(pairs, service.settings.model.pivot_lang)
        codes = sorted({t for targets in reachable.values() for t in targets})
        return [
            {"language": variant, "name": name, "supports_formality": False}
            for code in codes
            for variant, name in TARGET_VARIANTS.get(code, ((code.upper(), language_name(code)),))
        ]
    return [
        {"language": code.upper(), "name": language_name(code)}
        for code in sorted(source_languages(pairs))
    ]


@router.get(
    "/usage",
    summary="This client's characters through /v2 this month, and its limit (DeepL)",
    dependencies=[Depends(get_deepl_owner)],
)
async def usage(request: Request, service: Service, access: Access) -> dict[str, int]:
    used = service.quota.usage(access.identity(request))
    return {
        "character_count": used.characters,
        "character_limit": service.quota.limit or NO_CHARACTER_LIMIT,
        # This service's own: segments of those written from a translation memory.
        "translation_memory_segment_count": used.memory_segments,
    }


def _v2_card(info: GlossaryInfo) -> dict[str, Any]:
    return {**card(info).model_dump(exclude={"entries"}), "ready": True}


@router.get(
    "/glossary-language-pairs",
    summary="Pairs glossaries can be made for",
    dependencies=[Depends(get_deepl_owner)],
)
async def glossary_pairs(service: Service) -> dict[str, Any]:
    pairs = service.registry.by_pair if service.registry is not None else {}
    reachable = targets_by_source(pairs, service.settings.model.pivot_lang)
    return {
        "supported_languages": [
            {"source_lang": source, "target_lang": target}
            for source, targets in reachable.items()
            for target in targets
        ]
    }


@router.post(
    "/glossaries",
    status_code=201,
    summary="Create a glossary (DeepL API v2)",
    openapi_extra=_form(
        ["name", "source_lang", "target_lang", "entries"],
        {
            "name": _STRING,
            "source_lang": _STRING,
            "target_lang": _STRING,
            "entries": _STRING,
            "entries_format": {"type": "string", "enum": ["tsv", "csv"]},
        },
    ),
)
async def create(request: Request, service: Service, owner: DeepLOwner) -> dict[str, Any]:
    fields = await read_fields(request)
    entries = parse_entries(
        string_field(fields, "entries", required=True) or "",
        string_field(fields, "entries_format") or "tsv",
    )
    info = create_glossary(
        service,
        owner,
        string_field(fields, "name", required=True) or "",
        deepl_code(string_field(fields, "source_lang", required=True) or ""),
        deepl_code(string_field(fields, "target_lang", required=True) or ""),
        entries,
    )
    return _v2_card(info)


@router.get("/glossaries", summary="The stored glossaries (DeepL API v2)")
async def list_all(service: Service, owner: DeepLOwner) -> dict[str, Any]:
    return {"glossaries": [_v2_card(info) for info in service.glossaries.list(owner.key)]}


@router.get("/glossaries/{glossary_id}", summary="One glossary (DeepL API v2)")
async def get_one(glossary_id: str, service: Service, owner: DeepLOwner) -> dict[str, Any]:
    return _v2_card(service.glossaries.info(glossary_id, owner.key))


@router.get("/glossaries/{glossary_id}/entries", summary="A glossary's entries as TSV")
async def entries(glossary_id: str, service: Service, owner: DeepLOwner) -> Response:
    tsv = entries_tsv(service.glossaries.entries(glossary_id, owner.key))
    return Response(tsv, media_type="text/tab-separated-values; charset=utf-8")


@router.delete("/glossaries/{glossary_id}", status_code=204, summary="Delete a glossary")
async def delete(glossary_id: str, service: Service, owner: DeepLOwner) -> Response:
    service.glossaries.delete(glossary_id, owner.key)
    return Response(status_code=204)


# --- documents: DeepL's /v2/document on the service's document jobs ----------------------------

# DeepL has no "cancelled": a cancelled job reads as an error with that message.
_DEEPL_STATUS = {"queued": "queued", "translating": "translating", "done": "done"}


def _document(
    service: ServiceState, owner: Owner, document_id: str, fields: dict[str, Any]
) -> DocumentJob:
    """The job, if ``document_key`` is its key (the id alone does not open a document) and
    ``owner`` uploaded it."""
    key = string_field(fields, "document_key", required=True)
    try:
        job = owned_job(service, document_id, owner)
    except NotFound:
        job = None
    if job is None or not secrets.compare_digest(job.key, key or ""):
        raise ApiError(404, "document_not_found", "Document not found")
    return job


_KEY_BODY = _form(["document_key"], {"document_key": _STRING})


@router.post(
    "/document",
    summary="Upload a document to translate (DeepL API v2)",
    openapi_extra=upload_body(
        ["target_lang"], {"source_lang": _STRING, "target_lang": _STRING, "filename": _STRING}
    ),
)
async def upload_document(
    request: Request, service: Service, access: Access, owner: DeepLOwner
) -> dict[str, Any]:
    # Admitted as one request of no characters: they are charged once the file is read.
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "invalid_request", "Parameter 'file' not specified")
    form = await request.form()
    fields = {key: form.get(key) for key in form if key != "file"}
    target = string_field(fields, "target_lang", required=True) or ""
    source = string_field(fields, "source_lang")
    upload = form.get("file")
    if isinstance(upload, UploadFile) and (filename := string_field(fields, "filename")):
        upload.filename = filename  # DeepL's alternative to the file part's own name
    job = await submit(
        request,
        service,
        access,
        owner,
        upload,
        deepl_code(source) if source else None,
        deepl_code(target),
    )
    service.quota.record(access.identity(request), job.characters, 0)
    return {"document_id": job.job_id, "document_key": job.key}


@router.post(
    "/document/{document_id}", summary="A document's status (DeepL API v2)", openapi_extra=_KEY_BODY
)
async def document_status(
    document_id: str, request: Request, service: Service, owner: DeepLOwner
) -> dict[str, Any]:
    job = _document(service, owner, document_id, await read_fields(request))
    status: dict[str, Any] = {
        "document_id": job.job_id,
        "status": _DEEPL_STATUS.get(job.status, "error"),
    }
    if (seconds := job.seconds_left(time.time())) is not None:
        status["seconds_remaining"] = round(seconds)
    if job.status == "done":
        status["billed_characters"] = job.characters
    if job.status in ("error", "cancelled", "deleted"):
        status["error_message"] = job.error or job.status
    return status


@router.post(
    "/document/{document_id}/result",
    summary="The translated document (DeepL API v2)",
    openapi_extra=_KEY_BODY,
    response_class=FileResponse,
)
async def document_result(
    document_id: str, request: Request, service: Service, owner: DeepLOwner
) -> Response:
    fields = await read_fields(request)
    return result_response(service, _document(service, owner, document_id, fields))
