"""Which back-end holds the service's state: SQLite files under ``MT_DATA_DIR`` for one
process (the default), or one PostgreSQL database for every replica (``MT_DATABASE_URL``;
psycopg is imported only then)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.storage.database import Database
from service.storage.sqlite import (
    DOCUMENTS_FILE_NAME,
    FILE_NAME,
    LIMITS_FILE_NAME,
    SqliteDatabase,
)


@dataclass(frozen=True)
class Databases:
    """What the stores open: ``main`` for glossaries, memories and usage counts,
    ``documents`` for document jobs and their files, ``limits`` for rate-limit windows (one
    SQLite file each, the last written without waiting for the disk; one PostgreSQL database
    for all three)."""

    main: Database
    documents: Database
    limits: Database

    @property
    def shared_by_replicas(self) -> bool:
        """Whether processes on other machines may use the same state (PostgreSQL)."""
        return self.main.dialect != "sqlite"

    def close(self) -> None:
        self.main.close()
        self.documents.close()
        self.limits.close()

    def unreachable(self) -> str | None:
        return self.main.unreachable()


def open_databases(data_dir: Path, database_url: str | None, pool_size: int = 8) -> Databases:
    """SQLite under ``data_dir`` unless ``database_url`` names a PostgreSQL database."""
    if database_url:
        from service.storage.postgres import PostgresDatabase

        shared = PostgresDatabase(database_url, pool_size)
        return Databases(shared, shared, shared)
    # WAL: every front-end of the multi-process service opens these files, and readers then
    # do not wait for a writer.
    return Databases(
        SqliteDatabase(data_dir / FILE_NAME, write_ahead_log=True),
        SqliteDatabase(data_dir / DOCUMENTS_FILE_NAME, write_ahead_log=True),
        SqliteDatabase(data_dir / LIMITS_FILE_NAME, write_ahead_log=True),
    )
