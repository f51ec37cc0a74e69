"""Stored glossaries: named glossaries for a language pair, kept in the service's store so
they survive a restart and, on PostgreSQL, are known to every replica.

The tables live in the service's database (service/storage/database.py: the SQLite file
under ``MT_DATA_DIR`` or the database of ``MT_DATABASE_URL``). Entries are validated by
:meth:`Glossary.from_entries` before anything is written, and a glossary is written in one
transaction, so a refused glossary leaves the store as it was. A glossary is never changed
once stored, so its compiled form is kept per id: a request that names one asks the store
only whether it still exists (another replica may have deleted it), not for its terms.

``owner_key``: the API key id that created a glossary (None: shared, as every glossary is while
keys are off); a caller that names its key id sees its own glossaries and the shared ones.
"""

from __future__ import annotations

import builtins
import time
import uuid
from dataclasses import dataclass

from service.errors import NotFound
from service.storage.database import Database
from service.storage.migrations import Migration
from service.storage.owners import Owner
from service.storage.session import Session
from service.text.glossary import Glossary

MIGRATIONS = [
    Migration(
        1,
        """
        CREATE TABLE glossaries (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            source_lang TEXT NOT NULL,
            target_lang TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            entry_count INTEGER NOT NULL
        );
        CREATE TABLE glossary_entries (
            glossary_id TEXT NOT NULL REFERENCES glossaries(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            source TEXT NOT NULL,
            target TEXT NOT NULL,
            PRIMARY KEY (glossary_id, position)
        )
        """,
    ),
    Migration(2, "ALTER TABLE glossaries ADD COLUMN owner_key TEXT"),
]
_COLUMNS = "id, name, source_lang, target_lang, created_at, entry_count, owner_key"


def visible_to(owner_key: str | None) -> tuple[str, tuple[str, ...]]:
    """The condition (and its parameter) for the rows ``owner_key`` may see: all of them for
    None, else its own and the shared ones."""
    if owner_key is None:
        return "1 = 1", ()
    return "(owner_key IS NULL OR owner_key = ?)", (owner_key,)


@dataclass(frozen=True)
class GlossaryInfo:
    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    created_at: float  # seconds since the epoch
    entry_count: int
    owner_key: str | None = None  # the API key id that created it; None: shared


class GlossaryStore:
    def __init__(self, database: Database, max_entries: int) -> None:
        """``max_entries``: ``MT_MAX_GLOSSARY_ENTRIES``."""
        self.database = database
        database.add_migrations("glossaries", MIGRATIONS)
        self.max_entries = max_entries
        self._compiled: dict[str, Glossary] = {}

    def create(
        self,
        name: str,
        source_lang: str,
        target_lang: str,
        entries: list[tuple[str, str]],
        owner_key: str | None = None,
    ) -> GlossaryInfo:
        """Validate and store; ``GlossaryError``/``InputTooLarge`` before anything is written."""
        glossary = Glossary.from_entries(entries, self.max_entries, source_lang, target_lang)
        info = GlossaryInfo(
            uuid.uuid4().hex,
            name,
            source_lang,
            target_lang,
            time.time(),
            len(glossary.entries),
            owner_key,
        )
        with self.database.transaction() as db:  # all of it or nothing
            db.execute(
                f"INSERT INTO glossaries ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    info.glossary_id,
                    name,
                    source_lang,
                    target_lang,
                    info.created_at,
                    info.entry_count,
                    owner_key,
                ),
            )
            db.executemany(
                "INSERT INTO glossary_entries (glossary_id, position, source, target) "
                "VALUES (?, ?, ?, ?)",
                [(info.glossary_id, i, s, t) for i, (s, t) in enumerate(glossary.entries)],
            )
        self._compiled[info.glossary_id] = glossary
        return info

    def list(self, owner_key: str | None = None) -> list[GlossaryInfo]:
        condition, params = visible_to(owner_key)
        with self.database.read() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM glossaries WHERE {condition} ORDER BY created_at, id",
                params,
            )
            return [GlossaryInfo(*row) for row in rows]

    def info(self, glossary_id: str, owner_key: str | None = None) -> GlossaryInfo:
        with self.database.read() as db:
            row = self._info(db, glossary_id, owner_key)
        if row is None:
            raise NotFound(f"no glossary with id {glossary_id!r}", "glossary_not_found")
        return row

    @staticmethod
    def _info(db: Session, glossary_id: str, owner_key: str | None) -> GlossaryInfo | None:
        condition, params = visible_to(owner_key)
        row = db.execute(
            f"SELECT {_COLUMNS} FROM glossaries WHERE id = ? AND {condition}",
            (glossary_id, *params),
        ).fetchone()
        return GlossaryInfo(*row) if row is not None else None

    # ``builtins.list``: the class's own ``list`` method shadows the type here.
    def entries(
        self, glossary_id: str, owner_key: str | None = None
    ) -> builtins.list[tuple[str, str]]:
        self.info(glossary_id, owner_key)  # 404 for an unknown id rather than an empty list
        with self.database.read() as db:
            rows = db.execute(
                "SELECT source, target FROM glossary_entries WHERE glossary_id = ? "
                "ORDER BY position",
                (glossary_id,),
            )
            return [(source, target) for source, target in rows]

    def glossary(self, glossary_id: str, owner_key: str | None = None) -> Glossary:
        """The compiled glossary (404 for an unknown id, or one deleted meanwhile through
        another replica)."""
        info = self.info(glossary_id, owner_key)
        if (compiled := self._compiled.get(glossary_id)) is not None:
            return compiled
        # Stored entries passed validation when written; the limit may since have been
        # lowered, which must not make a stored glossary unusable.
        entries = self.entries(glossary_id)
        glossary = Glossary.from_entries(entries, len(entries), info.source_lang, info.target_lang)
        self._compiled[glossary_id] = glossary
        return glossary

    def delete(self, glossary_id: str, owner_key: str | None = None) -> None:
        """404 for an unknown id or another key's glossary; ``ReadOnly`` (403) for a shared
        one a key may only read."""
        Owner(owner_key).check_changes(self.info(glossary_id, owner_key).owner_key, "the glossary")
        condition, params = visible_to(owner_key)
        with self.database.transaction() as db:
            deleted = db.execute(
                f"DELETE FROM glossaries WHERE id = ? AND {condition}", (glossary_id, *params)
            ).rowcount
        self._compiled.pop(glossary_id, None)
        if not deleted:
            raise NotFound(f"no glossary with id {glossary_id!r}", "glossary_not_found")
