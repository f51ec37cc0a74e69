"""Versioned migrations per store, recorded in a table of their own,
``schema_migrations (component, version)``.

A store declares its schema as numbered steps (``database.add_migrations("glossaries",
[...])``); each step runs once, in one transaction with its record (DDL is transactional in
both back-ends, so a failed migration leaves no half schema), and on PostgreSQL under an
advisory lock, so replicas that start together migrate once. A table of our own rather than
alembic: the schema is a handful of tables written in SQL both back-ends run, and alembic
would bring SQLAlchemy, which nothing else here uses, into every image.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from service.storage.session import Session

MIGRATIONS_TABLE = """
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


def statements(script: str) -> list[str]:
    """The statements of a migration (none of ours holds a ``;`` inside a literal)."""
    return [part.strip() for part in script.split(";") if part.strip()]


def applied_versions(session: Session, component: str) -> list[int]:
    """The steps of ``component`` already applied, in order."""
    session.execute(MIGRATIONS_TABLE)
    rows = session.execute(
        "SELECT version FROM schema_migrations WHERE component = ? ORDER BY version",
        (component,),
    )
    return [version for (version,) in rows]


def apply_pending(
    session: Session, component: str, steps: Sequence[Migration], blob_type: str
) -> None:
    """Apply the steps of ``component`` not yet recorded; the caller holds a transaction
    (and, where replicas share the database, a lock that makes them take turns)."""
    applied = set(applied_versions(session, component))
    for step in steps:
        if step.version in applied:
            continue
        for statement in statements(step.sql.format(BLOB=blob_type)):
            session.execute(statement)
        session.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, ?)",
            (component, step.version, time.time()),
        )
