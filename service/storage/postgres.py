"""The PostgreSQL back-end of the service's store (``MT_DATABASE_URL=postgresql://...``): one
database that every replica shares, through psycopg 3 and its connection pool.

* **Imported only when chosen**, so the embedded default needs no driver.
* **Opened without waiting.** The pool connects in the background; a replica that starts
  while the database is down starts anyway, answers ``/ready`` with 503 and each request that
  needs the store with 503 and ``Retry-After`` (:class:`StoreUnavailable`), never with 500,
  and recovers by itself once the database is back. After a failed attempt the requests of
  the next :data:`_REFUSE_AFTER_FAILURE_S` are refused at once instead of each waiting the
  connect timeout.
* **Migrations** run on the first connection, each store's under one advisory lock, so
  replicas that start together migrate once (service/storage/migrations.py).
* **One truth.** Every read is a fresh query: no replica caches a row another may change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from service.errors import StoreUnavailable
from service.storage.database import Database
from service.storage.session import Session

# Seconds a request waits for a connection (or for the database to answer a new one)
# before it is refused with 503; short, since a client retries and /ready tells the balancer.
CONNECT_TIMEOUT_S = 5.0
_MIGRATION_LOCK = 5959_0001  # pg_advisory_xact_lock key: the service's schema changes
# /ready asks the database at most this often (an orchestrator probes every few seconds).
_PROBE_EVERY_S = 1.0
# After a failed attempt, requests are refused at once for this long rather than each
# waiting the connect timeout: a replica without its database answers 503 fast.
_REFUSE_AFTER_FAILURE_S = 2.0
_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)


def _redacted(url: str) -> str:
    """The URL without its password (it goes into logs and /ready's detail)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the configured database"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class PostgresDatabase(Database):
    dialect = "postgresql"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    blob_type = "BYTEA"

    def __init__(
        self, url: str, pool_size: int = 8, connect_timeout_s: float = CONNECT_TIMEOUT_S
    ) -> None:
        super().__init__()
        self.where = _redacted(url)
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max(pool_size, 1),
            open=False,
            timeout=connect_timeout_s,
            kwargs={"connect_timeout": max(int(connect_timeout_s), 1)},
            name="mtserve",
        )
        self._lock = threading.Lock()
        self._opened = False
        self._migrated: set[str] = set()
        self._probe: tuple[float, str | None] = (0.0, None)
        self._failure: tuple[float, str] | None = None  # (when, why) of the last failed attempt

    def _on_migrations_added(self, component: str) -> None:
        self._migrated.discard(component)

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self._lock:
            if not self._opened:
                self._pool.open(wait=False)
                self._opened = True
        if (failure := self._failure) and time.monotonic() - failure[0] < _REFUSE_AFTER_FAILURE_S:
            raise StoreUnavailable(failure[1])
        try:
            with self._pool.connection() as connection:
                self._failure = None
                session = Session(connection, "%s")
                if pending := [c for c in self._migrations if c not in self._migrated]:
                    self._apply(session, pending)
                yield session
        except _UNAVAILABLE as error:
            message = f"the database at {self.where} cannot be reached ({type(error).__name__})"
            self._failure = (time.monotonic(), message)
            raise StoreUnavailable(message) from error

    def _apply(self, session: Session, components: list[str]) -> None:
        with session.connection.transaction():
            session.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            for component in components:
                self._migrate(session, component)
        self._migrated.update(components)

    @contextmanager
    def read(self) -> Iterator[Session]:
        # The pool commits an open transaction when the block ends, rolls it back if it raises.
        with self._session() as session:
            yield session

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[Session]:
        with self._session() as session, session.connection.transaction():
            yield session

    def exists(self) -> bool:
        return True

    def serialize(self, session: Session, key: str) -> None:
        session.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (key,))

    def unreachable(self) -> str | None:
        checked_at, reason = self._probe
        if time.monotonic() - checked_at < _PROBE_EVERY_S:
            return reason
        try:
            with self.read() as db:
                db.execute("SELECT 1").fetchone()
            reason = None
        except StoreUnavailable as error:
            reason = error.message
        self._probe = (time.monotonic(), reason)
        return reason

    def close(self) -> None:
        with self._lock:
            if self._opened:
                self._pool.close()
                self._opened = False
