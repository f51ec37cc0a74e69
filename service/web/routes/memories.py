"""Translation memories: ``POST/GET /v1/memories``, ``GET/DELETE /v1/memories/{id}`` and
``GET /v1/memories/{id}/entries`` (JSON pairs: a segment may hold tabs and line breaks,
which TSV cannot carry).

A post adds approved pairs, as JSON entries or an uploaded TSV/CSV ``file``, to the memory
it names (created if new) or to its language pair's default memory
(service/storage/memories.py); a refused post stores nothing. Translation requests use
the pair's default memory unless they name another one or turn memories off.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.errors import ApiError
from service.storage.memories import (
    NO_MEMORY,
    MemoryChoice,
    MemoryInfo,
    MemoryUpdate,
)
from service.storage.owners import Owner
from service.translation.languages import LanguageCode, LanguagePair
from service.translation.routing import plan_route
from service.web.deps import CurrentOwner, Service, request_body
from service.web.errors import ERROR_RESPONSES
from service.web.lifecycle import ServiceState
from service.web.routes.glossaries import entries_of, iso_time, read_entries_body
from service.web.schemas import MemoryCard, MemoryEntries, MemoryList, MemoryPost

router = APIRouter()


def memory_choice(
    owner: Owner, memory_id: str | None = None, use_memory: bool = True
) -> MemoryChoice:
    """The memory a translation request asked for, among those ``owner`` reads."""
    if not use_memory:
        if memory_id is not None:
            raise ApiError(400, "memory_conflict", "memory_id with use_memory=false")
        return NO_MEMORY
    return MemoryChoice(memory_id, owner_key=owner.key)


def add_entries(
    service: ServiceState,
    owner: Owner,
    memory_id: str | None,
    source_lang: str,
    target_lang: str,
    entries: list[tuple[str, str]],
) -> MemoryUpdate:
    """Store approved pairs for a pair the service translates with a model (a memory for a
    pair no route serves, or for a language into itself, would never be asked)."""
    pair = LanguagePair(LanguageCode.parse(source_lang), LanguageCode.parse(target_lang))
    source, target = pair.source.code, pair.target.code
    if service.registry is not None:
        route = plan_route(pair, service.registry.by_pair, service.settings.model.pivot_lang)
        if not route.legs:
            raise ApiError(
                400,
                "memory_same_language",
                f"{source}->{target} is not translated (the text is returned as it is), so a "
                "memory for it would never be used",
            )
    return service.memories.add(memory_id, source, target, entries, owner.key)


def card(info: MemoryInfo, update: MemoryUpdate | None = None) -> MemoryCard:
    return MemoryCard(
        memory_id=info.memory_id,
        source_lang=info.source_lang,
        target_lang=info.target_lang,
        default=info.is_default,
        creation_time=iso_time(info.created_at),
        update_time=iso_time(info.updated_at),
        entry_count=info.entry_count,
        added=update.added if update is not None else None,
        replaced=update.replaced if update is not None else None,
    )


@router.post(
    "/v1/memories",
    response_model=MemoryCard,
    response_model_exclude_none=True,
    responses={**ERROR_RESPONSES, 201: {"model": MemoryCard}},
    summary="Add approved translations to a memory (JSON entries or a TSV/CSV upload)",
    # The body is read by hand (JSON or a multipart upload); the schema still tells clients
    # (and the fuzz tests) what it holds.
    openapi_extra=request_body(MemoryPost.model_json_schema(), "application/json"),
)
async def post(
    request: Request, response: Response, service: Service, owner: CurrentOwner
) -> MemoryCard:
    body = await read_entries_body(request, MemoryPost, "memory")
    update = add_entries(
        service, owner, body.memory_id, body.source_lang, body.target_lang, entries_of(body)
    )
    response.status_code = 201 if update.created else 200
    return card(update.info, update)


@router.get(
    "/v1/memories",
    response_model=MemoryList,
    response_model_exclude_none=True,
    summary="The translation memories",
)
async def list_all(service: Service, owner: CurrentOwner) -> MemoryList:
    return MemoryList(memories=[card(info) for info in service.memories.list(owner.key)])


@router.get(
    "/v1/memories/{memory_id}",
    response_model=MemoryCard,
    response_model_exclude_none=True,
    summary="One translation memory",
)
async def get_one(memory_id: str, service: Service, owner: CurrentOwner) -> MemoryCard:
    return card(service.memories.info(memory_id, owner.key))


@router.get(
    "/v1/memories/{memory_id}/entries",
    response_model=MemoryEntries,
    summary="A memory's approved pairs, [[source, target], ...] (the form a post takes)",
)
async def entries(memory_id: str, service: Service, owner: CurrentOwner) -> MemoryEntries:
    return MemoryEntries(entries=service.memories.entries(memory_id, owner.key))


@router.delete("/v1/memories/{memory_id}", status_code=204, summary="Delete a translation memory")
async def delete(memory_id: str, service: Service, owner: CurrentOwner) -> Response:
    service.memories.delete(memory_id, owner.key)
    return Response(status_code=204)
