"""The store's one interface: the service's state that outlives a request (glossaries,
memories, document jobs, usage counts, rate-limit windows), behind two back-ends: SQLite
files under ``MT_DATA_DIR`` (service/storage/sqlite.py, the embedded default: no server) or
one PostgreSQL database named by ``MT_DATABASE_URL`` (service/storage/postgres.py), which
every replica of a scaled-out service shares. :func:`service.storage.databases.open_databases`
picks the back-end.

The stores write their SQL once (service/storage/session.py) and declare their schema as
versioned migrations (service/storage/migrations.py); a :class:`Session` is the one thing a
store holds while it queries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from service.storage import migrations
from service.storage.migrations import Migration
from service.storage.session import Session


class Database(ABC):
    """Where the stores keep their rows."""

    dialect: str
    # Appended to a SELECT that claims a row: the rows other sessions hold are skipped
    # instead of waited for (PostgreSQL); SQLite has one writer at a time anyway.
    skip_locked = ""
    # The back-end's binary type, for ``{BLOB}`` in a migration.
    blob_type = "BLOB"

    def __init__(self) -> None:
        self._migrations: dict[str, list[Migration]] = {}

    def add_migrations(self, component: str, steps: Sequence[Migration]) -> None:
        """A store's schema, as numbered steps; the ones not yet applied run on first use."""
        self._migrations[component] = sorted(steps, key=lambda step: step.version)
        self._on_migrations_added(component)

    @abstractmethod
    def _on_migrations_added(self, component: str) -> None:
        """Apply them now where the database is already open."""

    def _migrate(self, session: Session, component: str) -> None:
        """Apply ``component``'s pending steps; the caller holds a transaction (and, where
        replicas share the database, a lock that makes them take turns)."""
        migrations.apply_pending(session, component, self._migrations[component], self.blob_type)

    def applied_versions(self, component: str) -> list[int]:
        with self.read() as db:
            return migrations.applied_versions(db, component)

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
