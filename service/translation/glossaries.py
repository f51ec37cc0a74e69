"""Stored glossaries: named glossaries for a language pair, kept in SQLite so they survive a
restart.

The tables live in the service's one SQLite file under ``MT_DATA_DIR``
(service/translation/database.py). Entries are validated by :meth:`Glossary.from_entries`
before anything is written, and a glossary is written in one transaction, so a refused
glossary leaves the store as it was. Compiled glossaries are kept per id: a request that
names one does not compile its terms again.
"""

from __future__ import annotations

import builtins
import time
import uuid
from dataclasses import dataclass

from service.errors import NotFound
from service.text.glossary import Glossary
from service.translation.database import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS glossaries (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    created_at REAL NOT NULL,
    entry_count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS glossary_entries (
    glossary_id TEXT NOT NULL REFERENCES glossaries(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    PRIMARY KEY (glossary_id, position)
);
"""


@dataclass(frozen=True)
class GlossaryInfo:
    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    created_at: float  # seconds since the epoch
    entry_count: int


class GlossaryStore:
    def __init__(self, database: Database, max_entries: int) -> None:
        """``max_entries``: ``MT_MAX_GLOSSARY_ENTRIES``."""
        self.database = database
        database.add_schema(_SCHEMA)
        self.max_entries = max_entries
        self._compiled: dict[str, Glossary] = {}

    def create(
        self,
        name: str,
        source_lang: str,
        target_lang: str,
        entries: list[tuple[str, str]],
    ) -> GlossaryInfo:
        """Validate and store; ``GlossaryError``/``InputTooLarge`` before anything is written."""
        glossary = Glossary.from_entries(entries, self.max_entries, source_lang, target_lang)
        info = GlossaryInfo(
            uuid.uuid4().hex, name, source_lang, target_lang, time.time(), len(glossary.entries)
        )
        with self.database.transaction() as db:  # all of it or nothing
            db.execute(
                "INSERT INTO glossaries VALUES (?, ?, ?, ?, ?, ?)",
                (
                    info.glossary_id,
                    name,
                    source_lang,
                    target_lang,
                    info.created_at,
                    info.entry_count,
                ),
            )
            db.executemany(
                "INSERT INTO glossary_entries VALUES (?, ?, ?, ?)",
                [(info.glossary_id, i, s, t) for i, (s, t) in enumerate(glossary.entries)],
            )
        self._compiled[info.glossary_id] = glossary
        return info

    def list(self) -> list[GlossaryInfo]:
        with self.database.read() as db:
            rows = db.execute("SELECT * FROM glossaries ORDER BY created_at, id")
            return [GlossaryInfo(*row) for row in rows]

    def info(self, glossary_id: str) -> GlossaryInfo:
        with self.database.read() as db:
            row = db.execute("SELECT * FROM glossaries WHERE id = ?", (glossary_id,)).fetchone()
        if row is None:
            raise NotFound(f"no glossary with id {glossary_id!r}", "glossary_not_found")
        return GlossaryInfo(*row)

    # ``builtins.list``: the class's own ``list`` method shadows the type here.
    def entries(self, glossary_id: str) -> builtins.list[tuple[str, str]]:
        self.info(glossary_id)  # 404 for an unknown id rather than an empty list
        with self.database.read() as db:
            rows = db.execute(
                "SELECT source, target FROM glossary_entries WHERE glossary_id = ? "
                "ORDER BY position",
                (glossary_id,),
            )
            return [(source, target) for source, target in rows]

    def glossary(self, glossary_id: str) -> Glossary:
        """The compiled glossary (404 for an unknown id)."""
        if (compiled := self._compiled.get(glossary_id)) is not None:
            return compiled
        info = self.info(glossary_id)
        # Stored entries passed validation when written; the limit may since have been
        # lowered, which must not make a stored glossary unusable.
        entries = self.entries(glossary_id)
        glossary = Glossary.from_entries(entries, len(entries), info.source_lang, info.target_lang)
        self._compiled[glossary_id] = glossary
        return glossary

    def delete(self, glossary_id: str) -> None:
        with self.database.transaction() as db:
            deleted = db.execute("DELETE FROM glossaries WHERE id = ?", (glossary_id,)).rowcount
        self._compiled.pop(glossary_id, None)
        if not deleted:
            raise NotFound(f"no glossary with id {glossary_id!r}", "glossary_not_found")
