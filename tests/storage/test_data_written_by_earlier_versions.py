"""Data directories the released service wrote open with this one: every store reads what
was stored and writes on, and no migration runs twice. ``written_by_earlier/`` holds SQL dumps
of the three SQLite files as the service wrote them before the store moved to
service/storage/ (glossaries, memories and a DeepL usage count; a finished and a queued
document job; a rate-limit window)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from service.storage.databases import Databases, open_databases
from service.storage.document_claims import DocumentClaims
from service.storage.documents import DocumentStore
from service.storage.glossaries import GlossaryStore
from service.storage.memories import PAIR_DEFAULT, MemoryChoice, MemoryStore
from service.storage.sqlite import DOCUMENTS_FILE_NAME, FILE_NAME, LIMITS_FILE_NAME
from service.web.quota import CharacterQuota, MonthlyUsage
from service.web.shared_limits import SharedRateLimiter

DUMPS = Path(__file__).parent / "written_by_earlier"
GLOSSARY_ID = "54ec8c54f9a1499591a94b584f7bb861"
DONE_JOB, QUEUED_JOB = "05e2e997079144f7a34f010bd0c28cfd", "bf62c7961d5b4b8aaef44f3206c281f2"
DUMPED_AT = 1795923412.0  # just after the dump was written (November 2026)
FOREVER_S = 1e12  # the dumped jobs finished long ago; no sweep may take them here


@pytest.fixture
def databases(tmp_path) -> Databases:
    for dump, name in (
        ("mtserve.sql", FILE_NAME),
        ("documents.sql", DOCUMENTS_FILE_NAME),
        ("limits.sql", LIMITS_FILE_NAME),
    ):
        with sqlite3.connect(tmp_path / name) as connection:
            connection.executescript((DUMPS / dump).read_text())
    opened = open_databases(tmp_path, None)
    yield opened
    opened.close()


def test_stored_glossaries_and_memories_read_and_grow(databases):
    glossaries = GlossaryStore(databases.main, 100)
    assert glossaries.entries(GLOSSARY_ID) == [("save", "sichern"), ("file", "Datei")]
    assert [info.name for info in glossaries.list("key-abc")] == ["ui", "mine"]
    assert [info.name for info in glossaries.list("key-other")] == ["ui"]
    memories = MemoryStore(databases.main, 1000)
    lookup = memories.lookup(PAIR_DEFAULT, "en", "de")
    assert lookup is not None and lookup("Save  the file") == "Datei speichern"
    own = memories.lookup(MemoryChoice("docs", owner_key="key-abc"), "en", "de")
    assert own is not None and own("Close") == "Schließen"
    update = memories.add(None, "en", "de", [("Open", "Öffnen")])
    assert not update.created and update.info.entry_count == 2
    assert databases.main.applied_versions("memories") == [1, 2]


def test_the_usage_count_and_the_rate_window_carry_on(databases):
    quota = CharacterQuota(databases.main, limit=0, clock=lambda: DUMPED_AT)
    quota.record("key:k", 5, 0)
    assert quota.usage("key:k") == MonthlyUsage(characters=17, memory_segments=1)
    # The dumped window holds 10 characters: 85 more fit in 100 a minute, 95 do not.
    limiter = SharedRateLimiter(databases.limits, clock=lambda: DUMPED_AT)
    allowed = dict(requests_per_minute=10, chars_per_minute=100)
    assert limiter.charge("key:k", chars=95, **allowed) is not None
    assert limiter.charge("key:k", chars=85, **allowed) is None


def test_document_jobs_keep_their_files_and_the_queued_one_is_claimed(databases):
    store = DocumentStore(databases.documents, ttl_s=FOREVER_S)
    done = store.get(DONE_JOB)
    assert done.status == "done" and done.owner_key == "key-abc"
    assert store.result(done) == b"Datei speichern\n"
    claimed = DocumentClaims(store).claim("holder-y", lease_s=30)
    assert claimed is not None and claimed.job_id == QUEUED_JOB
    assert store.upload(claimed) == b"Close\n"
    assert databases.documents.applied_versions("document_jobs") == [1, 2]
