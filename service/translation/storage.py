"""Which back-end holds the service's state: SQLite files under ``MT_DATA_DIR`` for one
process (the default), or one PostgreSQL database for every replica (``MT_DATABASE_URL``;
psycopg is imported only then)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.translation.database import FILE_NAME, Database, SqliteDatabase


@dataclass(frozen=True)
class Databases:
    """What the stores open: ``main`` for glossaries, memories and counters, ``documents``
    for document jobs and files (one SQLite file each; one PostgreSQL database for both)."""

    main: Database
    documents: Database

    def close(self) -> None:
        self.main.close()
        self.documents.close()

    def unreachable(self) -> str | None:
        return self.main.unreachable()


def open_databases(data_dir: Path, database_url: str | None, pool_size: int = 8) -> Databases:
    """SQLite under ``data_dir`` unless ``database_url`` names a PostgreSQL database."""
    if database_url:
        from service.translation.postgres import PostgresDatabase

        shared = PostgresDatabase(database_url, pool_size)
        return Databases(shared, shared)
    return Databases(
        SqliteDatabase(data_dir / FILE_NAME),
        SqliteDatabase(data_dir / "documents.sqlite3", write_ahead_log=True),
    )
