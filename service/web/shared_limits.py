"""Rate limits that hold across the front-ends of the multi-process service.

Each front-end has its own event loop and memory, so ``RateLimiter``'s in-memory windows
would let N front-ends allow N times a limit. ``SharedRateLimiter`` keeps the same moving
windows (requests and characters per minute per identity, the same refusals and
``Retry-After``) in a SQLite file every front-end opens: a charge reads the window and
records the hit in one ``BEGIN IMMEDIATE`` transaction, which SQLite serialises across
processes, so two front-ends never both take the last room. The hits are worth nothing after
a minute, so the file is written without waiting for the disk.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from pathlib import Path

from service.web.rate_limits import Clock, Refusal

WINDOW_S = 60.0
FILE_NAME = "limits.sqlite3"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS rate_hits (
    identity TEXT NOT NULL,
    unit TEXT NOT NULL,
    at REAL NOT NULL,
    cost INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_hits_window ON rate_hits (identity, unit, at);
"""


class SharedRateLimiter:
    """``RateLimiter``'s ``charge``, with the windows in ``data_dir/limits.sqlite3``."""

    def __init__(self, data_dir: Path, clock: Clock = time.time) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self.clock = clock
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._swept_at = 0.0

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(
                self.path, timeout=5.0, isolation_level=None, check_same_thread=False
            )
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA synchronous = OFF")
            connection.executescript(_SCHEMA)
            self._connection = connection
        return self._connection

    def charge(
        self, identity: str, *, chars: int, requests_per_minute: int, chars_per_minute: int
    ) -> Refusal | None:
        """Count one request of ``chars`` characters for ``identity``; a ``Refusal`` if a
        limit has no room for it (nothing is counted then)."""
        checks: list[tuple[str, int, int]] = []  # unit, limit, cost
        if requests_per_minute > 0:
            checks.append(("requests", requests_per_minute, 1))
        if chars_per_minute > 0 and chars > 0:
            checks.append(("characters", chars_per_minute, chars))
        if not checks:
            return None
        with self._lock:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                refusal = self._charge(db, identity, checks)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("ROLLBACK" if refusal is not None else "COMMIT")
        return refusal

    def _charge(
        self, db: sqlite3.Connection, identity: str, checks: list[tuple[str, int, int]]
    ) -> Refusal | None:
        now = self.clock()
        start = now - WINDOW_S
        if now - self._swept_at > WINDOW_S:  # every identity's old hits, once a minute
            db.execute("DELETE FROM rate_hits WHERE at < ?", (start,))
            self._swept_at = now
        for unit, limit, cost in checks:  # in order: the first refusal is the answer
            if cost > limit:  # can never pass
                message = (
                    f"this request has {cost} {unit}; the limit is {limit} {unit} per 1 minute"
                )
                return Refusal(message, None)
            hits = db.execute(
                "SELECT at, cost FROM rate_hits WHERE identity = ? AND unit = ? AND at >= ? "
                "ORDER BY at DESC",
                (identity, unit, start),
            ).fetchall()
            # Newest first: the hit that holds the (limit - cost + 1)-th unit must leave the
            # window before this request fits.
            held = 0
            for at, hit_cost in hits:
                held += hit_cost
                if held > limit - cost:
                    wait_s = at + WINDOW_S - now
                    return Refusal(f"{limit} {unit} per 1 minute", max(1, math.ceil(wait_s)))
        db.executemany(
            "INSERT INTO rate_hits VALUES (?, ?, ?, ?)",
            [(identity, unit, now, cost) for unit, _, cost in checks],
        )
        return None

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
