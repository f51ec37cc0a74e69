"""The service's state that outlives a request, behind one interface with two back-ends:
SQLite files under ``MT_DATA_DIR`` (the embedded default: no server, one process) or one
PostgreSQL database named by ``MT_DATABASE_URL`` (service/translation/postgres.py), which
every replica of a scaled-out service shares.

The stores (glossaries, memories, document jobs, usage counters, rate-limit windows) write
their SQL once, in the subset both back-ends speak: ``?`` placeholders, ``INSERT ... ON
CONFLICT ... DO UPDATE``, ``RETURNING``; ``{BLOB}`` in a migration names the binary type. A
:class:`Session` is the one thing a store holds while it queries.

**Migrations** are versioned per store (``add_migrations("glossaries", [...])``) and recorded
in a table of their own, ``schema_migrations (component, version)``: each runs once, in one
transaction with its record (DDL is transactional in both back-ends, so a failed migration
leaves no half schema), and on PostgreSQL under an advisory lock, so replicas that start
together migrate once. A table of our own rather than alembic: the schema is a handful of
tables written in SQL both back-ends run, and alembic would bring SQLAlchemy, which nothing
else here uses, into every image.

The SQLite file is opened on first use, so a process that never stores anything creates
nothing. Its one connection is shared by every store behind one lock: calls are short (one
small query or one transaction) and come from the event loop or a worker thread. A data
directory from before memories existed holds ``glossaries.sqlite3``; it is renamed on first
use, so its glossaries stay.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from service.errors import StoreUnavailable

FILE_NAME = "mtserve.sqlite3"
_EARLIER_FILE_NAME = "glossaries.sqlite3"
# What the document jobs keep under MT_DATA_DIR (service/translation/document_jobs.py).
_DOCUMENTS_FILE_NAME = "documents.sqlite3"
_DOCUMENTS_DIR = "documents"


def _switch_to_wal(connection: sqlite3.Connection, patience_s: float = 10.0) -> None:
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


_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    component TEXT NOT NULL,
    version INTEGER NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (component, version)
)
"""


@dataclass(frozen=True)
class Migration:
    """One step of a store's schema: ``version`` counts from 1; ``sql`` is one or more
    statements separated by ``;`` (``{BLOB}``: the back-end's binary type)."""

    version: int
    sql: str


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Session:
    """A connection as the stores use it: SQL with ``?`` placeholders, on either back-end."""

    def __init__(self, connection: Any, placeholder: str) -> None:
        self.connection = connection
        self._placeholder = placeholder

    def _sql(self, sql: str) -> str:
        return sql if self._placeholder == "?" else sql.replace("?", self._placeholder)

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        cursor: Cursor = self.connection.execute(self._sql(sql), tuple(params))
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        rows = [tuple(row) for row in rows]
        if not rows:
            return
        if self._placeholder == "?":
            self.connection.executemany(sql, rows)
        else:
            with self.connection.cursor() as cursor:
                cursor.executemany(self._sql(sql), rows)


def statements(script: str) -> list[str]:
    """The statements of a migration (none of ours holds a ``;`` inside a literal)."""
    return [part.strip() for part in script.split(";") if part.strip()]


class Database(ABC):
    """Where the stores keep their rows; :func:`open_database` picks the back-end."""

    dialect: str
    # Appended to a SELECT that claims a row: the rows other sessions hold are skipped
    # instead of waited for (PostgreSQL); SQLite has one writer at a time anyway.
    skip_locked = ""
    # The back-end's binary type, for ``{BLOB}`` in a migration.
    blob_type = "BLOB"

    def __init__(self) -> None:
        self._migrations: dict[str, list[Migration]] = {}

    def add_migrations(self, component: str, migrations: Sequence[Migration]) -> None:
        """A store's schema, as numbered steps; the ones not yet applied run on first use."""
        self._migrations[component] = sorted(migrations, key=lambda step: step.version)
        self._on_migrations_added(component)

    @abstractmethod
    def _on_migrations_added(self, component: str) -> None:
        """Apply them now where the database is already open."""

    def _migrate(self, session: Session, component: str) -> None:
        """Apply ``component``'s pending steps; the caller holds a transaction (and, where
        replicas share the database, a lock that makes them take turns)."""
        session.execute(_MIGRATIONS_TABLE)
        applied = {
            version
            for (version,) in session.execute(
                "SELECT version FROM schema_migrations WHERE component = ?", (component,)
            )
        }
        for step in self._migrations[component]:
            if step.version in applied:
                continue
            for statement in statements(step.sql.format(BLOB=self.blob_type)):
                session.execute(statement)
            session.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                (component, step.version, time.time()),
            )

    def applied_versions(self, component: str) -> list[int]:
        with self.read() as db:
            db.execute(_MIGRATIONS_TABLE)
            rows = db.execute(
                "SELECT version FROM schema_migrations WHERE component = ? ORDER BY version",
                (component,),
            )
            return [version for (version,) in rows]

    @abstractmethod
    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for queries."""
        yield  # type: ignore[misc]

    @abstractmethod
    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[Session]:
        """A session in one transaction: all of it is written or, if the block raises, none
        of it. ``durable=False``: a commit that may be lost in a power cut (progress counts)
        need not wait for the disk where the back-end lets it."""
        yield  # type: ignore[misc]

    @abstractmethod
    def exists(self) -> bool:
        """Whether anything was ever stored (asking creates nothing)."""

    def unreachable(self) -> str | None:
        """Why the database cannot be used now, or None (``/ready``)."""
        return None

    @abstractmethod
    def serialize(self, session: Session, key: str) -> None:
        """Make transactions that name ``key`` take turns until this one ends."""

    @abstractmethod
    def close(self) -> None: ...


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
                earlier = self.path.with_name(_EARLIER_FILE_NAME)
                if self.path.name == FILE_NAME and earlier.exists() and not self.path.exists():
                    earlier.replace(self.path)
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
                _switch_to_wal(connection)
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
