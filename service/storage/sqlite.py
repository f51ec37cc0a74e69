"""The embedded back-end: SQLite files under ``MT_DATA_DIR``, no server, one machine.

Each file is opened on first use, so a process that never stores anything creates nothing.
Its one connection is shared by every store behind one lock: calls are short (one small query
or one transaction) and come from the event loop or a worker thread. The files are in WAL
mode (service/storage/databases.py): every front-end of the multi-process service opens them,
and readers then do not wait for a writer.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.errors import StoreUnavailable
from service.storage.database import Database
from service.storage.session import Session

FILE_NAME = "mtserve.sqlite3"  # glossaries, memories, usage counts
DOCUMENTS_FILE_NAME = "documents.sqlite3"  # document jobs and their files
LIMITS_FILE_NAME = "limits.sqlite3"  # rate-limit windows


def switch_to_wal(connection: sqlite3.Connection, patience_s: float = 10.0) -> None:
    """``PRAGMA journal_mode = WAL``, retried: the switch takes the file's exclusive lock
    without waiting for it, so processes that open a new file together find it locked."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def store_problem(data_dir: Path) -> str | None:
    """Why the store under ``data_dir`` cannot be written, or None when it can: the directory
    is created if missing and a file is written and removed in it, and the SQLite files
    already there must be writable. Checked at start-up: a process that
    cannot store would otherwise say ready and then fail every request that reads a memory."""
    where = data_dir.absolute()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        return f"the data directory {where} (MT_DATA_DIR) is not writable: {reason}"
    for name in (FILE_NAME, DOCUMENTS_FILE_NAME, LIMITS_FILE_NAME):
        if (data_dir / name).exists() and not os.access(data_dir / name, os.W_OK):
            return f"{where / name} (under MT_DATA_DIR) is not writable"
    return None


class SqliteDatabase(Database):
    """One SQLite file, one connection, one lock."""

    dialect = "sqlite"

    def __init__(self, path: Path, write_ahead_log: bool = False) -> None:
        """``write_ahead_log``: commits that are not ``durable`` do not wait for the disk (a
        crash loses at most the last of them); for a file written after every chunk of a
        document."""
        super().__init__()
        self.path = path
        self.write_ahead_log = write_ahead_log
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.RLock()

    def _on_migrations_added(self, component: str) -> None:
        with self._lock:
            if self._connection is not None:
                self._apply(self._connection, component)

    def _apply(self, connection: sqlite3.Connection, component: str) -> None:
        connection.execute("BEGIN IMMEDIATE")
        try:
            self._migrate(Session(connection, "?"), component)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def _open(self) -> sqlite3.Connection:
        if self._connection is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Autocommit mode: transactions are begun and ended here, explicitly, so that
                # DDL and a claim's read-then-write take the write lock at their start.
                connection = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None
                )
            except (OSError, sqlite3.OperationalError) as error:
                # An unwritable MT_DATA_DIR is the operator's to fix (/ready says so): 503.
                raise StoreUnavailable(
                    f"the store is unavailable: MT_DATA_DIR cannot be written "
                    f"({type(error).__name__})"
                ) from error
            connection.execute("PRAGMA foreign_keys = ON")
            if self.write_ahead_log:
                switch_to_wal(connection)
                connection.execute("PRAGMA synchronous = NORMAL")
            for component in self._migrations:
                self._apply(connection, component)
            self._connection = connection
        return self._connection

    def exists(self) -> bool:
        return self._connection is not None or self.path.exists()

    def serialize(self, session: Session, key: str) -> None:
        """Nothing to do: a transaction here takes the write lock at its start, so writers
        take turns already."""

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._lock:
            yield Session(self._open(), "?")

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[Session]:
        with self._lock:
            connection = self._open()
            relaxed = self.write_ahead_log and not durable
            if self.write_ahead_log and durable:
                connection.execute("PRAGMA synchronous = FULL")
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield Session(connection, "?")
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            finally:
                if connection.in_transaction:
                    connection.execute("COMMIT")
                if self.write_ahead_log and not relaxed:
                    connection.execute("PRAGMA synchronous = NORMAL")

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
