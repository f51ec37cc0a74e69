"""DeepL's usage and character quota: what each client translated through ``/v2/translate``
this calendar month (UTC), and ``MT_DEEPL_CHARACTER_LIMIT``, the most it may (0: no limit).

DeepL counts characters per account and billing period and answers 456 once the limit is
reached; ``/v2/usage`` reports the count and the limit, which its clients read (the
``deepl`` client's ``Usage.any_limit_reached``). Here the account is the API key, or the
client's address when keys are off (service/web/access.py), and the period is the calendar
month. The counts live in the service's store (service/storage/), so a restart neither resets
a quota nor forgets the usage, and replicas sharing a PostgreSQL database count one usage.

A request is refused when its characters would take the client past the limit, before any
work; it is counted after it is translated (concurrent requests may together pass the limit
by what they were already allowed).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

from service.storage.database import Database
from service.storage.migrations import Migration
from service.web.errors import ApiError
from service.web.rate_limits import Clock

MIGRATIONS = [
    Migration(
        1,
        """
        CREATE TABLE deepl_usage (
            identity TEXT NOT NULL,
            period TEXT NOT NULL,
            characters BIGINT NOT NULL,
            memory_segments BIGINT NOT NULL,
            PRIMARY KEY (identity, period)
        )
        """,
    ),
]
QUOTA_EXCEEDED = "Quota exceeded. The character limit has been reached."


@dataclass(frozen=True)
class MonthlyUsage:
    """What one client translated through ``/v2/translate`` this month (a request's own token
    counts are the ``usage`` of ``/v1``'s response, service/web/schemas.py)."""

    characters: int
    memory_segments: int  # of the segments translated, those written from a memory


class CharacterQuota:
    def __init__(self, database: Database, limit: int, clock: Clock = time.time) -> None:
        """``limit``: characters per client and month (``MT_DEEPL_CHARACTER_LIMIT``; 0: no
        limit)."""
        self.database = database
        database.add_migrations("deepl_usage", MIGRATIONS)
        self.limit = limit
        self.clock = clock

    def _period(self) -> str:
        return datetime.datetime.fromtimestamp(self.clock(), datetime.UTC).strftime("%Y-%m")

    def usage(self, identity: str) -> MonthlyUsage:
        with self.database.read() as db:
            row = db.execute(
                "SELECT characters, memory_segments FROM deepl_usage "
                "WHERE identity = ? AND period = ?",
                (identity, self._period()),
            ).fetchone()
        return MonthlyUsage(*row) if row is not None else MonthlyUsage(0, 0)

    def check(self, identity: str, characters: int) -> None:
        """456 (DeepL's status) when ``characters`` more would pass the limit."""
        if self.limit and self.usage(identity).characters + characters > self.limit:
            raise ApiError(456, "quota_exceeded", QUOTA_EXCEEDED)

    def record(self, identity: str, characters: int, memory_segments: int) -> None:
        with self.database.transaction() as db:
            db.execute(
                "INSERT INTO deepl_usage (identity, period, characters, memory_segments) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (identity, period) "
                "DO UPDATE SET characters = deepl_usage.characters + excluded.characters, "
                "memory_segments = deepl_usage.memory_segments + excluded.memory_segments",
                (identity, self._period(), characters, memory_segments),
            )
