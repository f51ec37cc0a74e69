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

import os
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.errors import StoreUnavailable

FILE_NAME = "mtserve.sqlite3"
_EARLIER_FILE_NAME = "glossaries.sqlite3"
# What the document jobs keep under MT_DATA_DIR (service/translation/document_jobs.py).
_DOCUMENTS_FILE_NAME = "documents.sqlite3"
_DOCUMENTS_DIR = "documents"


def store_problem(data_dir: Path) -> str | None:
    """Why the store under ``data_dir`` cannot be written, or None when it can: the directory
    and its ``documents/`` are created if missing and a file is written and removed in each,
    and the SQLite files already there must be writable. Checked at start-up: a process that
    cannot store would otherwise say ready and then fail every request that reads a memory."""
    where = data_dir.absolute()
    try:
        for directory in (data_dir, data_dir / _DOCUMENTS_DIR):
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        return f"the data directory {where} (MT_DATA_DIR) is not writable: {reason}"
    for name in (FILE_NAME, _DOCUMENTS_FILE_NAME):
        if (data_dir / name).exists() and not os.access(data_dir / name, os.W_OK):
            return f"{where / name} (under MT_DATA_DIR) is not writable"
    return None


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
            try:
                self._connection = self._connect()
            except (OSError, sqlite3.OperationalError) as error:
                # An unwritable MT_DATA_DIR is the operator's to fix (/ready says so): 503.
                raise StoreUnavailable(
                    f"stored glossaries and memories are unavailable: MT_DATA_DIR cannot be "
                    f"written ({type(error).__name__})"
                ) from error
        return self._connection

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        earlier = self.path.with_name(_EARLIER_FILE_NAME)
        if earlier.exists() and not self.path.exists():
            earlier.replace(self.path)
        connection = sqlite3.connect(self.path, check_same_thread=False)
        connection.execute("PRAGMA foreign_keys = ON")
        for schema in self._schemas:
            connection.executescript(schema)
        return connection

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
