"""The service's one SQLite file under ``MT_DATA_DIR``: stored glossaries and translation
memories live in it side by side.

The file (``mtserve.sqlite3``) is opened on first use, so a process that never touches a
glossary or a memory creates nothing; each store's tables are created then. One connection
is shared by every store, behind one lock: calls are short (one small query or one
transaction) and come from the event loop or, for a large request's text work, from a worker
thread.

A data directory from before memories existed holds ``glossaries.sqlite3``; it is renamed on
first use, so its glossaries stay.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FILE_NAME = "mtserve.sqlite3"
_EARLIER_FILE_NAME = "glossaries.sqlite3"


class Database:
    def __init__(self, data_dir: Path) -> None:
        """``data_dir``: ``MT_DATA_DIR`` (created on first use)."""
        self.path = data_dir / FILE_NAME
        self._schemas: list[str] = []
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.RLock()

    def add_schema(self, schema: str) -> None:
        """Tables a store needs (``CREATE ... IF NOT EXISTS``), created on first use."""
        self._schemas.append(schema)
        if self._connection is not None:
            self._connection.executescript(schema)

    def _open(self) -> sqlite3.Connection:
        if self._connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            earlier = self.path.with_name(_EARLIER_FILE_NAME)
            if earlier.exists() and not self.path.exists():
                earlier.replace(self.path)
            connection = sqlite3.connect(self.path, check_same_thread=False)
            connection.execute("PRAGMA foreign_keys = ON")
            # every front-end of the multi-process service opens this file: readers do not
            # wait for a writer
            connection.execute("PRAGMA journal_mode = WAL")
            for schema in self._schemas:
                connection.executescript(schema)
            self._connection = connection
        return self._connection

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, for queries."""
        with self._lock:
            yield self._open()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, in one transaction: all of it is written or, if
        the block raises, none of it."""
        with self._lock:
            connection = self._open()
            with connection:
                yield connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
