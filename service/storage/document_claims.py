"""Document jobs as the runners see them: claimed by exactly one process, under a lease.

:meth:`DocumentClaims.claim` takes the oldest queued job, or one whose lease ran out (its
process died), in one transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL: claimers skip
each other's rows) and writes the claimer's id (:func:`process_holder`) and a lease until
``now + lease_s``. Every later write by the claimer (progress, the result, a failure) names
its id and lands only while the job is still its own, so a process that lost its lease cannot
overwrite the one that took over.

On SQLite every claimer is a front-end of this machine (the multi-process service): a job
whose holder's process is gone (killed, or a previous run) is claimable at once, its lease
notwithstanding. Replicas sharing PostgreSQL may run on other machines or in other containers
(whose process ids say nothing here): there only the lease hands a job over.
"""

from __future__ import annotations

import os
import time
from functools import cache
from pathlib import Path

from service.storage.documents import DocumentJob, DocumentStore, job_row, put_file
from service.storage.session import Session

# A job that may be claimed: queued, or translating under a lease that ran out (a lease of
# NULL: ended because its holder's process is gone).
CLAIMABLE = (
    "(status = 'queued' OR (status = 'translating' AND (lease_until IS NULL OR lease_until < ?)))"
)
HELD = "id = ? AND status = 'translating' AND lease_holder = ?"


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot) from /proc, None where it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "no-boot-id"


@cache
def process_holder() -> str:
    """This process as a jobs' holder: ``boot/pid/start time`` (a pid used again, or a
    restarted process, is another holder)."""
    pid = os.getpid()
    return f"{_boot_id()}/{pid}/{_start_time(pid)}"


def holder_gone(holder: str) -> bool:
    """Whether ``holder`` names a process of this machine, since this boot, that no longer
    runs (False where it cannot tell: another machine, or not a process id)."""
    boot, _, rest = holder.partition("/")
    pid, _, started = rest.partition("/")
    if boot != _boot_id() or not pid.isdigit():
        return False
    return _start_time(int(pid)) != started


class DocumentClaims:
    """The claims on ``store``'s jobs: who translates which, until when, and how far."""

    def __init__(self, store: DocumentStore) -> None:
        self.store = store
        self.database = store.database

    @property
    def shared(self) -> bool:
        """Whether other replicas claim the same jobs (then only a lease hands one over)."""
        return self.database.dialect != "sqlite"

    def claim(self, holder: str, lease_s: float) -> DocumentJob | None:
        """The oldest claimable job, now ``holder``'s until ``now + lease_s`` (None: none)."""
        if not self.database.exists():  # a server never sent a document creates nothing
            return None
        now = time.time()
        with self.database.transaction() as db:
            if not self.shared:
                self._expire_gone_holders(db)
            row = db.execute(
                f"SELECT id FROM document_jobs WHERE {CLAIMABLE} "
                f"ORDER BY created_at, id LIMIT 1{self.database.skip_locked}",
                (now,),
            ).fetchone()
            if row is None:
                return None
            claimed = db.execute(
                "UPDATE document_jobs SET status = 'translating', sentences_done = 0, "
                f"started_at = ?, lease_holder = ?, lease_until = ? WHERE id = ? AND {CLAIMABLE}",
                (now, holder, now + lease_s, row[0], now),
            ).rowcount
            return job_row(db, row[0]) if claimed else None

    @staticmethod
    def _expire_gone_holders(db: Session) -> None:
        """End the leases of holders whose process is gone (SQLite: they are all of this
        machine)."""
        holders = db.execute(
            "SELECT DISTINCT lease_holder FROM document_jobs "
            "WHERE status = 'translating' AND lease_holder IS NOT NULL"
        ).fetchall()
        for (holder,) in holders:
            if holder_gone(holder):
                db.execute(
                    "UPDATE document_jobs SET lease_until = NULL "
                    "WHERE status = 'translating' AND lease_holder = ?",
                    (holder,),
                )

    def _update_held(self, job_id: str, holder: str, durable: bool, **fields: object) -> bool:
        """Write ``fields`` if ``holder`` still holds the job; whether it did."""
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self.database.transaction(durable) as db:
            return bool(
                db.execute(
                    f"UPDATE document_jobs SET {assignments} WHERE {HELD}",
                    (*fields.values(), job_id, holder),
                ).rowcount
            )

    def renew(self, job_id: str, holder: str, lease_s: float) -> bool:
        """Extend ``holder``'s lease; False once the job is no longer its own (cancelled, or
        taken over after its lease ran out)."""
        return self._update_held(job_id, holder, False, lease_until=time.time() + lease_s)

    def progress(self, job_id: str, holder: str, sentences_done: int, lease_s: float) -> bool:
        """Progress, which also says the holder is alive: the lease is extended."""
        return self._update_held(
            job_id, holder, False, sentences_done=sentences_done, lease_until=time.time() + lease_s
        )

    def release(self, job_id: str, holder: str) -> bool:
        """Back to the queue (the holder stops): the next claim, here or elsewhere, starts
        it again at once."""
        return self._update_held(
            job_id, holder, True, status="queued", sentences_done=0, lease_holder=None
        )

    def finish(self, job: DocumentJob, holder: str, result_name: str, content: bytes) -> bool:
        """The result and the row that says done, in one transaction, if ``holder`` still
        holds the job (not cancelled, not taken over); whether it did."""
        with self.database.transaction() as db:
            done = db.execute(
                "UPDATE document_jobs SET status = 'done', sentences_done = sentences_total, "
                f"result_name = ?, finished_at = ?, lease_until = NULL WHERE {HELD}",
                (result_name, time.time(), job.job_id, holder),
            ).rowcount
            if done:
                put_file(db, job.job_id, "result", content)
        return bool(done)

    def fail(self, job_id: str, holder: str, message: str) -> bool:
        return self._update_held(
            job_id, holder, True, status="error", error=message, finished_at=time.time()
        )
