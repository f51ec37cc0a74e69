"""Which translation memories exist, kept per process until a memory is written anywhere.

Most requests come from owners who have no memory; knowing that without a query saves the
lookup its database round trip. A SQLite file's writers replace a stamp file beside it after
each commit, and a reader compares that file's identity (one ``stat``) with the one its
answers were kept under. On PostgreSQL nothing is kept (service/storage/memories.py says why).
"""

from __future__ import annotations

import os
import time

from service.storage.database import Database


class ExistingMemories:
    """Which stored memory ids exist, as the database said since the last write anywhere.

    ``stamp`` names a file the writers replace after each commit (None: keep nothing, ask
    the database every time). A reader stats the file *before* it asks the database and
    keeps the answer under that stat: a write it may have missed has replaced the file since,
    so the next lookup sees another stat and asks again."""

    LIMIT = 10_000  # ids kept at most (owners x pairs asked for); past it, start over

    @classmethod
    def beside(cls, database: Database) -> ExistingMemories:
        """Kept under a stamp file beside a SQLite file; kept nowhere on PostgreSQL."""
        return cls(_stamp_of(database))

    def __init__(self, stamp: os.PathLike[str] | None) -> None:
        self.stamp = stamp
        # (the stat the answers were kept under, the answers): one attribute, so that a
        # thread never pairs one write's stat with answers kept before it.
        self._kept: tuple[object, dict[str, bool]] = (None, {})

    def _current(self) -> object:
        try:
            found = os.stat(self.stamp)  # type: ignore[arg-type]
        except FileNotFoundError:
            return ()
        # A replacement is a new inode; the time tells apart an inode number used again.
        return (found.st_ino, found.st_mtime_ns, found.st_size)

    def which(self, database: Database, stored_ids: list[str]) -> list[str]:
        """Those of ``stored_ids`` that exist, in their order."""
        if self.stamp is None:
            return _existing(database, stored_ids)
        seen = self._current()
        kept, exists = self._kept
        if seen != kept or len(exists) > self.LIMIT:
            exists = {}
            self._kept = (seen, exists)
        unknown = [stored_id for stored_id in stored_ids if stored_id not in exists]
        if unknown:
            found = set(_existing(database, unknown))
            for stored_id in unknown:
                exists[stored_id] = stored_id in found
        return [stored_id for stored_id in stored_ids if exists[stored_id]]

    def changed(self) -> None:
        """After a committed write: every reader of the database asks it again."""
        if self.stamp is None:
            return
        stamp = os.fspath(self.stamp)
        temporary = f"{stamp}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="ascii") as file:
            file.write(f"{time.time_ns()} {os.getpid()}\n")
        os.replace(temporary, stamp)


def _existing(database: Database, stored_ids: list[str]) -> list[str]:
    with database.read() as db:
        return [
            stored_id
            for stored_id in stored_ids
            if db.execute("SELECT 1 FROM memories WHERE id = ?", (stored_id,)).fetchone()
        ]


def _stamp_of(database: Database) -> os.PathLike[str] | None:
    """The file whose replacement says "memories changed", beside a SQLite file; None where
    the database is shared beyond one file system (PostgreSQL)."""
    path = getattr(database, "path", None) if database.dialect == "sqlite" else None
    return path.with_name(f"{path.name}.memories-changed") if path is not None else None
