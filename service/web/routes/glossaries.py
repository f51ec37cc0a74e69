"""Stored glossaries: ``POST/GET/DELETE /v1/glossaries`` and ``GET /v1/glossaries/{id}``,
and what both translation APIs share: turning a request's ``glossary`` or ``glossary_id``
into the glossary the pipeline enforces (service/text/glossary.py).

A glossary is created from JSON entries or from an uploaded TSV/CSV file (multipart, field
``file``); it is validated before anything is stored (service/storage/glossaries.py), so
a refused one leaves the stored ones as they were.
"""

from __future__ import annotations

import datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from service.storage.glossaries import GlossaryInfo, GlossaryStore
from service.storage.owners import Owner
from service.text.glossary import Glossary, GlossaryError, parse_entries
from service.translation.languages import LanguageCode, LanguagePair
from service.translation.routing import plan_route
from service.web.deps import CurrentOwner, Service, json_body, request_body, sends_form
from service.web.errors import ERROR_RESPONSES, ApiError, validated
from service.web.lifecycle import ServiceState
from service.web.schemas import GlossaryCard, GlossaryCreate, GlossaryList, MemoryPost

router = APIRouter()
Body = TypeVar("Body", bound=BaseModel)


def request_glossary(
    service: ServiceState, owner: Owner, inline: dict[str, str] | None, glossary_id: str | None
) -> Glossary | None:
    """The glossary a translation request carries: inline entries or the id of a stored one
    ``owner`` reads."""
    if inline is not None and glossary_id is not None:
        raise GlossaryError("glossary_conflict", "send either glossary or glossary_id, not both")
    if glossary_id is not None:
        return service.glossaries.glossary(glossary_id, owner.key)
    if inline is not None:
        return Glossary.from_entries(inline.items(), service.settings.access.max_glossary_entries)
    return None


def create_glossary(
    service: ServiceState,
    owner: Owner,
    name: str,
    source_lang: str,
    target_lang: str,
    entries: list[tuple[str, str]],
) -> GlossaryInfo:
    """Store a glossary for a pair the service translates (a glossary for a pair no route
    serves could never be used)."""
    pair = LanguagePair(LanguageCode.parse(source_lang), LanguageCode.parse(target_lang))
    source, target = pair.source.code, pair.target.code
    if service.registry is not None:
        plan_route(pair, service.registry.by_pair, service.settings.model.pivot_lang)
    return service.glossaries.create(name, source, target, entries, owner.key)


def iso_time(seconds: float) -> str:
    """``2024-05-01T12:00:00.123456Z``: the form DeepL's clients parse."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def card(info: GlossaryInfo, entries: list[tuple[str, str]] | None = None) -> GlossaryCard:
    return GlossaryCard(
        glossary_id=info.glossary_id,
        name=info.name,
        source_lang=info.source_lang,
        target_lang=info.target_lang,
        creation_time=iso_time(info.created_at),
        entry_count=info.entry_count,
        entries=dict(entries) if entries is not None else None,
    )


async def read_entries_body(request: Request, schema: type[Body], what: str) -> Body:
    """A glossary's or a memory's body (``what`` names it in errors): JSON, or form fields
    with the entries as an uploaded ``file`` (format from ``entries_format`` or the file
    name's ``.csv``/``.tsv``)."""
    data: Any
    if sends_form(request):
        form = await request.form()
        data = {key: form.get(key) for key in form if key != "file"}
        upload = form.get("file")
        if upload is not None and not isinstance(upload, str):
            try:
                data["entries"] = (await upload.read()).decode("utf-8-sig")
            except UnicodeDecodeError as error:
                raise ApiError(
                    400, f"invalid_{what}_entries", "the entries file is not UTF-8 text"
                ) from error
            if "entries_format" not in data and (upload.filename or "").lower().endswith(".csv"):
                data["entries_format"] = "csv"
    else:
        data = await json_body(request)
    return validated(schema, data, f"invalid {what}")


def entries_of(body: GlossaryCreate | MemoryPost) -> list[tuple[str, str]]:
    if isinstance(body.entries, str):
        return parse_entries(body.entries, body.entries_format)
    if isinstance(body.entries, dict):
        return list(body.entries.items())
    return [tuple(entry) for entry in body.entries]  # type: ignore[misc]


@router.post(
    "/v1/glossaries",
    status_code=201,
    response_model=GlossaryCard,
    responses={**ERROR_RESPONSES, 404: ERROR_RESPONSES[400]},
    summary="Store a glossary for a language pair (JSON entries or a TSV/CSV upload)",
    # The body is read by hand (JSON or a multipart upload); the schema still tells clients
    # (and the fuzz tests) what it holds.
    openapi_extra=request_body(GlossaryCreate.model_json_schema(), "application/json"),
)
async def create(request: Request, service: Service, owner: CurrentOwner) -> GlossaryCard:
    body = await read_entries_body(request, GlossaryCreate, "glossary")
    info = create_glossary(
        service, owner, body.name, body.source_lang, body.target_lang, entries_of(body)
    )
    return card(info)


@router.get("/v1/glossaries", response_model=GlossaryList, summary="The stored glossaries")
async def list_all(service: Service, owner: CurrentOwner) -> GlossaryList:
    return GlossaryList(glossaries=[card(info) for info in service.glossaries.list(owner.key)])


@router.get(
    "/v1/glossaries/{glossary_id}",
    response_model=GlossaryCard,
    response_model_exclude_none=True,
    summary="One stored glossary with its entries",
)
async def get_one(glossary_id: str, service: Service, owner: CurrentOwner) -> GlossaryCard:
    store: GlossaryStore = service.glossaries
    return card(store.info(glossary_id, owner.key), store.entries(glossary_id, owner.key))


@router.delete("/v1/glossaries/{glossary_id}", status_code=204, summary="Delete a glossary")
async def delete(glossary_id: str, service: Service, owner: CurrentOwner) -> Response:
    service.glossaries.delete(glossary_id, owner.key)
    return Response(status_code=204)
