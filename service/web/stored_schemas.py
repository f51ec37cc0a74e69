"""Pydantic models of the stored items' request and response bodies: glossaries, translation
memories and document jobs (``/v1/glossaries``, ``/v1/memories``, ``/v1/documents``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from service.web.schemas import valid_unicode


def valid_entries(
    value: dict[str, str] | list[tuple[str, str]] | str,
) -> dict[str, str] | list[tuple[str, str]] | str:
    """Glossary or memory entries in valid Unicode: they are stored as UTF-8, where an
    unpaired surrogate cannot be written."""
    if isinstance(value, str):
        valid_unicode(value)
    else:
        pairs = value.items() if isinstance(value, dict) else value
        valid_unicode([term for pair in pairs for term in pair])
    return value


class GlossaryCreate(BaseModel):
    """``POST /v1/glossaries`` as JSON (a multipart upload carries the same fields, with the
    entries as a ``file``)."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(min_length=1, max_length=200)
    source_lang: StrictStr = Field(min_length=1)
    target_lang: StrictStr = Field(min_length=1)
    entries: dict[StrictStr, StrictStr] | list[tuple[StrictStr, StrictStr]] | StrictStr = Field(
        description="{source: target}, [[source, target], ...], or TSV/CSV text "
        "(see entries_format)."
    )
    entries_format: Literal["tsv", "csv"] = Field(
        "tsv", description="How entries given as text are laid out."
    )

    _valid_unicode = field_validator("name", "source_lang", "target_lang")(valid_unicode)

    _valid_entries = field_validator("entries")(valid_entries)


class GlossaryCard(BaseModel):
    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    creation_time: str = Field(description="ISO 8601, UTC.")
    entry_count: int
    entries: dict[str, str] | None = Field(None, description="GET /v1/glossaries/{id} only.")


class GlossaryList(BaseModel):
    glossaries: list[GlossaryCard]


class MemoryPost(BaseModel):
    """``POST /v1/memories`` as JSON (a multipart upload carries the same fields, with the
    entries as a ``file``)."""

    model_config = ConfigDict(extra="forbid")

    source_lang: StrictStr = Field(min_length=1)
    target_lang: StrictStr = Field(min_length=1)
    memory_id: StrictStr | None = Field(
        None,
        description="The memory to add to (created if new): 1 to 64 letters, digits, '.', "
        "'_' or '-'. Omitted: the language pair's default memory, which every request of "
        "the pair uses unless it names another.",
    )
    entries: dict[StrictStr, StrictStr] | list[tuple[StrictStr, StrictStr]] | StrictStr = Field(
        description="Approved pairs: {source: target}, [[source, target], ...], or TSV/CSV "
        "text (see entries_format). A source the memory holds gets the new target."
    )
    entries_format: Literal["tsv", "csv"] = Field(
        "tsv", description="How entries given as text are laid out."
    )

    _valid_unicode = field_validator("source_lang", "target_lang", "memory_id")(valid_unicode)

    _valid_entries = field_validator("entries")(valid_entries)


class MemoryCard(BaseModel):
    memory_id: str
    source_lang: str
    target_lang: str
    default: bool = Field(description="Whether this is the language pair's default memory.")
    creation_time: str = Field(description="ISO 8601, UTC.")
    update_time: str = Field(description="ISO 8601, UTC: the last post.")
    entry_count: int
    added: int | None = Field(None, description="POST only: pairs new to the memory.")
    replaced: int | None = Field(
        None, description="POST only: pairs whose source the memory held, now with the new target."
    )


class MemoryList(BaseModel):
    memories: list[MemoryCard]


class MemoryEntries(BaseModel):
    entries: list[tuple[str, str]]


class DocumentJobStatus(BaseModel):
    """``/v1/documents/{id}``: a document job and its progress."""

    id: str
    status: Literal["queued", "translating", "done", "error", "cancelled", "deleted"]
    filename: str
    source_lang: str = Field(description="`auto` when detected")
    target_lang: str
    sentences_done: int
    sentences_total: int
    progress: float = Field(description="sentences done / total, 0 to 1")
    seconds_left: float | None = Field(
        None, description="estimated from the rate so far; null until a sentence is done"
    )
    error: str | None = None
    result_url: str | None = Field(None, description="where the document is, once done")
