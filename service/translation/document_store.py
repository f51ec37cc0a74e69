"""Document jobs: a file uploaded now, translated in the background, its progress polled and
its result downloaded later (``/v1/documents`` and DeepL's ``/v2/document``). This module is
the jobs' store; service/translation/document_jobs.py's runner translates them.

Decisions:

* **One truth, every replica.** A job's row and its files (the upload, the result) live in
  the service's database (service/translation/database.py): ``documents.sqlite3`` under
  ``MT_DATA_DIR``, or the PostgreSQL database every replica shares. Files go into the
  database rather than onto a shared volume: an upload is already size-limited
  (``MT_MAX_BODY_BYTES``), a row and its file commit in one transaction (a job never names a
  missing file, a half-written result is never served), and a replica needs nothing but the
  database URL (most Kubernetes clusters have no volume that many pods write at once).
* **Claimed by exactly one process, under a lease.** :meth:`DocumentStore.claim` takes the
  oldest queued job, or one whose lease ran out (its process died), in one transaction
  (``FOR UPDATE SKIP LOCKED`` on PostgreSQL: claimers skip each other's rows) and writes the
  claimer's id (:func:`process_owner`) and a lease until ``now + lease_s``. Every later
  write by the claimer (progress, the result, a failure) names its id and lands only while
  the job is still its own, so a process that lost its lease cannot overwrite the one that
  took over.
* **A dead front-end's jobs at once.** On SQLite every claimer is a front-end of this machine
  (the multi-process service): a job whose holder's process is gone (killed, or a previous
  run) is claimable at once, its lease notwithstanding. Replicas sharing PostgreSQL may run
  on other machines or in other containers (whose process ids say nothing here): there only
  the lease hands a job over.
* **Progress in sentences** (as the segmenter splits the texts), written after every chunk
  and readable from every replica, with an estimate of the time left.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from dataclasses import astuple, dataclass
from functools import cache
from pathlib import Path

from service.errors import NotFound
from service.text.segmenter import sentence_spans
from service.translation.database import Database, Migration, Session

logger = logging.getLogger(__name__)

UNFINISHED = ("queued", "translating")

MIGRATIONS = [
    # The schema from before versioned migrations (IF NOT EXISTS: such a file already has it).
    Migration(
        1,
        """
        CREATE TABLE IF NOT EXISTS document_jobs (
            id TEXT PRIMARY KEY,
            key TEXT NOT NULL,
            filename TEXT NOT NULL,
            source_lang TEXT NOT NULL,
            target_lang TEXT NOT NULL,
            status TEXT NOT NULL,
            sentences_total INTEGER NOT NULL,
            sentences_done INTEGER NOT NULL,
            characters BIGINT NOT NULL,
            error TEXT,
            result_name TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION,
            finished_at DOUBLE PRECISION
        )
        """,
    ),
    Migration(
        2,
        """
        ALTER TABLE document_jobs ADD COLUMN owner_key TEXT;
        ALTER TABLE document_jobs ADD COLUMN lease_holder TEXT;
        ALTER TABLE document_jobs ADD COLUMN lease_until DOUBLE PRECISION;
        CREATE INDEX document_jobs_by_status ON document_jobs (status, created_at);
        CREATE TABLE document_files (
            job_id TEXT NOT NULL REFERENCES document_jobs(id) ON DELETE CASCADE,
            kind TEXT NOT NULL,
            content {BLOB} NOT NULL,
            PRIMARY KEY (job_id, kind)
        )
        """,
    ),
]
_COLUMNS = (
    "id, key, filename, source_lang, target_lang, status, sentences_total, sentences_done, "
    "characters, error, result_name, created_at, started_at, finished_at, owner_key"
)
# A job that may be claimed: queued, or translating under a lease that ran out (a lease of
# NULL: a row from before leases, left translating by a process that stopped).
_CLAIMABLE = (
    "(status = 'queued' OR (status = 'translating' AND (lease_until IS NULL OR lease_until < ?)))"
)
_HELD = "id = ? AND status = 'translating' AND lease_holder = ?"


@dataclass(frozen=True)
class DocumentJob:
    job_id: str
    key: str  # DeepL's document_key: the second half of the credential to a job
    filename: str
    source_lang: str  # "auto" when detected
    target_lang: str
    status: str  # queued → translating → done | error | cancelled
    sentences_total: int
    sentences_done: int
    characters: int
    error: str | None
    result_name: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    owner_key: str | None = None  # the API key id that submitted it; None: keys are off

    def seconds_left(self, now: float) -> float | None:
        """The time left at the rate so far (None until a sentence is done)."""
        if self.status != "translating" or not self.started_at or self.sentences_done <= 0:
            return None
        rate = self.sentences_done / max(now - self.started_at, 1e-3)
        return max(self.sentences_total - self.sentences_done, 0) / rate


def count_sentences(texts: list[str], language: str) -> int:
    """How many sentences the segmenter makes of ``texts`` (a text without one counts one)."""
    return sum(max(len(sentence_spans(text, language)), 1) for text in texts)


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
def process_owner() -> str:
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


class DocumentStore:
    """Job rows and their files in ``database``."""

    def __init__(self, database: Database, ttl_s: float, legacy_dir: Path | None = None) -> None:
        """``ttl_s``: finished jobs (and their files) older than this are deleted.
        ``legacy_dir``: ``MT_DATA_DIR``, where jobs from before files lived in the database
        kept them (``documents/<id>/``); read while such a job is still there."""
        self.database = database
        database.add_migrations("document_jobs", MIGRATIONS)
        self.ttl_s = ttl_s
        self.legacy_dir = legacy_dir

    @property
    def shared(self) -> bool:
        """Whether other replicas use the same jobs (then only a lease hands one over)."""
        return self.database.dialect != "sqlite"

    def create(
        self,
        filename: str,
        content: bytes,
        source_lang: str,
        target_lang: str,
        sentences: int,
        characters: int,
        owner_key: str | None = None,
    ) -> DocumentJob:
        """Store the row and its upload in one transaction: a job never names a missing file.
        The client is told 202 once it is committed (durably)."""
        self.sweep()
        job = DocumentJob(
            uuid.uuid4().hex,
            uuid.uuid4().hex,
            filename,
            source_lang,
            target_lang,
            "queued",
            sentences,
            0,
            characters,
            None,
            None,
            time.time(),
            None,
            None,
            owner_key,
        )
        with self.database.transaction() as db:
            marks = ", ".join("?" * len(astuple(job)))
            # The dataclass's fields are the columns, in order.
            db.execute(f"INSERT INTO document_jobs ({_COLUMNS}) VALUES ({marks})", astuple(job))
            _put_file(db, job.job_id, "upload", content)
        return job

    def get(self, job_id: str) -> DocumentJob:
        if not self.database.exists():  # asking about a job creates no database
            raise NotFound(f"no document job with id {job_id!r}", "document_not_found")
        with self.database.read() as db:
            job = _job(db, job_id)
        if job is None:
            raise NotFound(f"no document job with id {job_id!r}", "document_not_found")
        return job

    def counts(self) -> dict[str, tuple[int, int]]:
        """State -> (jobs, sentences left), for /metrics; empty while nothing can be read."""
        if not self.database.exists():  # a scrape creates no database
            return {}
        try:
            with self.database.read() as db:
                rows = db.execute(
                    "SELECT status, COUNT(*), SUM(CASE WHEN sentences_total > sentences_done "
                    "THEN sentences_total - sentences_done ELSE 0 END) "
                    "FROM document_jobs GROUP BY status"
                ).fetchall()
        except Exception as error:  # noqa: BLE001 - a scrape reports what it can
            logger.warning("document job counts unreadable: %s", error)
            return {}
        return {status: (int(jobs), int(left or 0)) for status, jobs, left in rows}

    def claim(self, holder: str, lease_s: float) -> DocumentJob | None:
        """The oldest claimable job, now ``holder``'s until ``now + lease_s`` (None: none)."""
        if not self.database.exists():  # a server never sent a document creates nothing
            return None
        now = time.time()
        with self.database.transaction() as db:
            if not self.shared:
                self._expire_gone_holders(db)
            row = db.execute(
                f"SELECT id FROM document_jobs WHERE {_CLAIMABLE} "
                f"ORDER BY created_at, id LIMIT 1{self.database.skip_locked}",
                (now,),
            ).fetchone()
            if row is None:
                return None
            claimed = db.execute(
                "UPDATE document_jobs SET status = 'translating', sentences_done = 0, "
                f"started_at = ?, lease_holder = ?, lease_until = ? WHERE id = ? AND {_CLAIMABLE}",
                (now, holder, now + lease_s, row[0], now),
            ).rowcount
            return _job(db, row[0]) if claimed else None

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
                    f"UPDATE document_jobs SET {assignments} WHERE {_HELD}",
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
                f"result_name = ?, finished_at = ?, lease_until = NULL WHERE {_HELD}",
                (result_name, time.time(), job.job_id, holder),
            ).rowcount
            if done:
                _put_file(db, job.job_id, "result", content)
        return bool(done)

    def fail(self, job_id: str, holder: str, message: str) -> bool:
        return self._update_held(
            job_id, holder, True, status="error", error=message, finished_at=time.time()
        )

    def upload(self, job: DocumentJob) -> bytes:
        content = self._file(job.job_id, "upload")
        if content is None:
            raise NotFound(f"the upload of document job {job.job_id!r} is gone")
        return content

    def result(self, job: DocumentJob) -> bytes | None:
        """The finished document, only for a job whose row says done."""
        return self._file(job.job_id, "result") if job.status == "done" else None

    def _file(self, job_id: str, kind: str) -> bytes | None:
        with self.database.read() as db:
            row = db.execute(
                "SELECT content FROM document_files WHERE job_id = ? AND kind = ?", (job_id, kind)
            ).fetchone()
        if row is not None:
            return bytes(row[0])
        legacy = self._legacy_files(job_id)
        if legacy is not None and (legacy / kind).is_file():
            return (legacy / kind).read_bytes()
        return None

    def _legacy_files(self, job_id: str) -> Path | None:
        return self.legacy_dir / "documents" / job_id if self.legacy_dir is not None else None

    def cancel(self, job_id: str) -> DocumentJob:
        """Cancel an unfinished job and delete its files; a finished one's files go too (the
        client is done with them; a done job reads ``deleted``, as /result's 410 says). The
        row stays so that status still answers; the replica translating it finds the job no
        longer its own and stops."""
        self.get(job_id)  # 404 first
        with self.database.transaction() as db:
            db.execute(
                "UPDATE document_jobs SET status = 'cancelled', finished_at = ?, "
                "lease_until = NULL WHERE id = ? AND status IN (?, ?)",
                (time.time(), job_id, *UNFINISHED),
            )
            db.execute(
                "UPDATE document_jobs SET status = 'deleted' WHERE id = ? AND status = 'done'",
                (job_id,),
            )
            db.execute("DELETE FROM document_files WHERE job_id = ?", (job_id,))
        if (legacy := self._legacy_files(job_id)) is not None:
            shutil.rmtree(legacy, ignore_errors=True)
        return self.get(job_id)

    def sweep_orphans(self) -> int:
        """Delete upload folders under the legacy ``documents/`` that no row names (an
        earlier version, killed between writing an upload and committing its row, left
        them); returns how many. Run at start-up."""
        folders = self.legacy_dir / "documents" if self.legacy_dir is not None else None
        if folders is None or not folders.is_dir():
            return 0
        candidates = [path for path in folders.iterdir() if path.is_dir()]
        if not candidates:  # nothing to sweep: the jobs' database is not even opened
            return 0
        known: set[str] = set()
        if self.database.exists():
            with self.database.read() as db:
                known = {job_id for (job_id,) in db.execute("SELECT id FROM document_jobs")}
        orphans = [path for path in candidates if path.name not in known]
        for path in orphans:
            shutil.rmtree(path, ignore_errors=True)
        return len(orphans)

    def sweep(self) -> int:
        """Delete finished jobs older than the TTL, rows and files; returns how many."""
        if not self.database.exists():
            return 0
        cutoff = time.time() - self.ttl_s
        with self.database.transaction() as db:
            expired = [
                job_id
                for (job_id,) in db.execute(
                    "DELETE FROM document_jobs WHERE status NOT IN (?, ?) AND finished_at < ? "
                    "RETURNING id",
                    (*UNFINISHED, cutoff),
                ).fetchall()
            ]
        for job_id in expired:
            if (legacy := self._legacy_files(job_id)) is not None:
                shutil.rmtree(legacy, ignore_errors=True)
        return len(expired)

    def close(self) -> None:
        self.database.close()


def _job(db: Session, job_id: str) -> DocumentJob | None:
    row = db.execute(f"SELECT {_COLUMNS} FROM document_jobs WHERE id = ?", (job_id,)).fetchone()
    return DocumentJob(*row) if row is not None else None


def _put_file(db: Session, job_id: str, kind: str, content: bytes) -> None:
    db.execute(
        "INSERT INTO document_files (job_id, kind, content) VALUES (?, ?, ?) "
        "ON CONFLICT (job_id, kind) DO UPDATE SET content = excluded.content",
        (job_id, kind, content),
    )
