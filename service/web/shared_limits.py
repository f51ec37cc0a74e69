"""Rate limits that hold across processes: the front-ends of the multi-process service
(``limits.sqlite3`` under ``MT_DATA_DIR``, which each opens) and replicas sharing PostgreSQL
(``MT_DATABASE_URL``), so N processes enforce one limit (one process alone keeps them in
memory, service/web/rate_limits.py).

The same moving window of 60 s as the in-memory limiter, with the same answers: a request is
allowed when the costs charged to its identity in the last 60 s leave room for its own, and a
refusal says when enough of them will have left the window (``Retry-After``). Each charge is
one row per unit (requests, characters) with its cost, written in one transaction that first
takes the identity's lock (an advisory lock on PostgreSQL; SQLite has one writer at a time),
so two processes charging one key at once are counted one after the other. Rows that left
the window are deleted by the identity's next charge, and everyone's now and then; the hits
are worth nothing after a minute, so SQLite writes them without waiting for the disk.

Times come from the replica's clock (injected, for tests); replicas' clocks are assumed to
agree to well under a second (NTP), as the window is a minute.
"""

from __future__ import annotations

import math
import time

from service.storage.database import Database
from service.storage.migrations import Migration
from service.storage.session import Session
from service.web.rate_limits import Clock, Refusal

WINDOW_S = 60.0
SWEEP_EVERY = 256  # charges between deletions of every identity's expired rows

MIGRATIONS = [
    Migration(
        1,
        """
        CREATE TABLE rate_events (
            identity TEXT NOT NULL,
            unit TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            cost BIGINT NOT NULL
        );
        CREATE INDEX rate_events_by_identity ON rate_events (identity, unit, at)
        """,
    ),
]


class SharedRateLimiter:
    """``RateLimiter``'s ``charge``, with the windows in ``database``."""

    def __init__(self, database: Database, clock: Clock = time.time) -> None:
        self.database = database
        database.add_migrations("rate_limits", MIGRATIONS)
        self.clock = clock
        self._charges = 0

    def charge(
        self, identity: str, *, chars: int, requests_per_minute: int, chars_per_minute: int
    ) -> Refusal | None:
        """As ``RateLimiter.charge``: count one request of ``chars`` characters, or say why
        not (nothing is counted then)."""
        checks: list[tuple[str, int, int]] = []  # (unit, limit, cost)
        if requests_per_minute > 0:
            checks.append(("requests", requests_per_minute, 1))
        if chars_per_minute > 0 and chars > 0:
            checks.append(("characters", chars_per_minute, chars))
        if not checks:
            return None
        now = self.clock()
        with self.database.transaction(durable=False) as db:
            self.database.serialize(db, f"rate:{identity}")
            for unit, limit, cost in checks:
                if (refusal := _refusal(db, identity, unit, limit, cost, now)) is not None:
                    return refusal
            db.executemany(
                "INSERT INTO rate_events (identity, unit, at, cost) VALUES (?, ?, ?, ?)",
                [(identity, unit, now, cost) for unit, _, cost in checks],
            )
            db.execute(
                "DELETE FROM rate_events WHERE identity = ? AND at < ?",
                (identity, now - WINDOW_S),
            )
            self._charges += 1
            if self._charges % SWEEP_EVERY == 0:
                db.execute("DELETE FROM rate_events WHERE at < ?", (now - WINDOW_S,))
        return None


def _refusal(
    db: Session, identity: str, unit: str, limit: int, cost: int, now: float
) -> Refusal | None:
    """Why ``cost`` more does not fit ``identity``'s window for ``unit``, or None."""
    described = f"{limit} {unit} per 1 minute"
    if cost > limit:
        return Refusal(f"this request has {cost} {unit}; the limit is {described}", None)
    rows = db.execute(
        "SELECT at, cost FROM rate_events WHERE identity = ? AND unit = ? AND at >= ? ORDER BY at",
        (identity, unit, now - WINDOW_S),
    ).fetchall()
    used = sum(row_cost for _, row_cost in rows)
    if used + cost <= limit:
        return None
    for at, row_cost in rows:  # oldest first: when has enough left the window?
        used -= row_cost
        if used + cost <= limit:
            return Refusal(described, max(1, math.ceil(at + WINDOW_S - now)))
    raise AssertionError("unreachable: the cost alone fits the limit")
