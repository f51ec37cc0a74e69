"""Per-client rate limits: requests and characters per minute, over a moving window.

The `limits` library does the bookkeeping (``MovingWindowRateLimiter``: a request is allowed
when the window of the last 60 s holds room for its cost; characters are a cost of one per
character). Its in-memory storage reads the wall clock itself; ``ClockedMemoryStorage`` is
that storage with the clock injected, so tests step a fake clock instead of sleeping, and so
a refusal can say exactly when there will be room again (``Retry-After``).

The moving window keeps one entry per unit of cost (that is how ``limits`` counts a cost),
so a characters-per-minute limit holds up to that many entries per client: fine for the tens
or hundreds of thousands a translation API allows per minute, not for billions.

A limit of 0 is no limit. A cost larger than the whole limit (one request with more
characters than the per-minute allowance) can never pass; it is refused with the reason.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.storage.memory import Entry
from limits.strategies import MovingWindowRateLimiter

Clock = Callable[[], float]


class ClockedMemoryStorage(MemoryStorage):
    """limits' ``MemoryStorage`` for the moving-window strategy, with time from ``clock``
    (seconds, same epoch as ``time.time``: the library's expiry timer uses the real one)."""

    def __init__(self, clock: Clock = time.time) -> None:
        super().__init__()
        self.clock = clock

    def _entry(self, expiry: float) -> Entry:
        entry = Entry.__new__(Entry)
        entry.atime = self.clock()
        entry.expiry = entry.atime + expiry
        return entry

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        with self.locks[key]:
            events = self.events.setdefault(key, [])  # newest first
            now = self.clock()
            blocking = events[limit - amount] if len(events) > limit - amount else None
            if blocking is not None and blocking.atime >= now - expiry:
                return False
            events[:0] = [self._entry(expiry)] * amount
            return True

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        now = self.clock()
        events = self.events.get(key, [])
        in_window = sum(1 for entry in events[:limit] if entry.atime >= now - expiry)
        if in_window == 0:
            return now, 0
        return events[in_window - 1].atime, in_window

    def seconds_until_room(self, key: str, limit: int, expiry: int, amount: int) -> float:
        """How long until ``amount`` more fits the window (inf if it never can)."""
        if amount > limit:
            return math.inf
        events = self.events.get(key, [])
        if len(events) <= limit - amount:
            return 0.0
        return max(0.0, events[limit - amount].atime + expiry - self.clock())


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused and when to come back."""

    message: str
    retry_after_s: int | None  # None: never (the cost is above the whole limit)


class RateLimiter:
    """Requests and characters per minute per identity (an API key or a client address)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self.storage = ClockedMemoryStorage(clock)
        self.window = MovingWindowRateLimiter(self.storage)

    def charge(
        self, identity: str, *, chars: int, requests_per_minute: int, chars_per_minute: int
    ) -> Refusal | None:
        """Count one request of ``chars`` characters for ``identity``; a ``Refusal`` if a
        limit has no room for it (nothing is counted then)."""
        checks: list[tuple[RateLimitItemPerMinute, int, str]] = []
        if requests_per_minute > 0:
            checks.append(
                (RateLimitItemPerMinute(requests_per_minute, namespace="requests"), 1, "requests")
            )
        if chars_per_minute > 0 and chars > 0:
            checks.append(
                (RateLimitItemPerMinute(chars_per_minute, namespace="chars"), chars, "characters")
            )
        for item, cost, unit in checks:
            if not self.window.test(item, identity, cost=cost):
                return self._refusal(item, identity, cost, unit)
        for item, cost, unit in checks:
            if not self.window.hit(item, identity, cost=cost):  # raced by another request
                return self._refusal(item, identity, cost, unit)
        return None

    def _refusal(
        self, item: RateLimitItemPerMinute, identity: str, cost: int, unit: str
    ) -> Refusal:
        limit = f"{item.amount} {unit} per 1 minute"
        wait = self.storage.seconds_until_room(
            item.key_for(identity), item.amount, item.get_expiry(), cost
        )
        if math.isinf(wait):
            return Refusal(f"this request has {cost} {unit}; the limit is {limit}", None)
        return Refusal(limit, max(1, math.ceil(wait)))
