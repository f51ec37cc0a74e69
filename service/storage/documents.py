"""Document jobs: a file uploaded now, translated in the background, its progress polled and
its result downloaded later (``/v1/documents`` and DeepL's ``/v2/document``). This module is
the jobs' store as clients see it (submit, status, result, cancel);
service/storage/document_claims.py is the runners' side (claim, lease, progress, finish), and
service/translation/document_jobs.py's runner translates them.

Decisions:

* **One truth, every replica.** A job's row and its files (the upload, the result) live in
  the service's database (service/storage/database.py): ``documents.sqlite3`` under
  ``MT_DATA_DIR``, or the PostgreSQL database every replica shares. Files go into the
  database rather than onto a shared volume: an upload is already size-limited
  (``MT_MAX_BODY_BYTES``), a row and its file commit in one transaction (a job never names a
  missing file, a half-written result is never served), and a replica needs nothing but the
  database URL (most Kubernetes clusters have no volume that many pods write at once).
* **Claimed by exactly one process, under a lease** (service/storage/document_claims.py).
* **Progress in sentences** (as the segmenter splits the texts), written after every chunk
  and readable from every replica, with an estimate of the time left.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import astuple, dataclass

from service.errors import NotFound
from service.storage.database import Database
from service.storage.migrations import Migration
from service.storage.session import Session

logger = logging.getLogger(__name__)

UNFINISHED = ("queued", "translating")

MIGRATIONS = [
    Migration(
        1,
        """
        CREATE TABLE document_jobs (
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
COLUMNS = (
    "id, key, filename, source_lang, target_lang, status, sentences_total, sentences_done, "
    "characters, error, result_name, created_at, started_at, finished_at, owner_key"
)


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


class DocumentStore:
    """Job rows and their files in ``database``."""

    def __init__(self, database: Database, ttl_s: float) -> None:
        """``ttl_s``: finished jobs (and their files) older than this are deleted."""
        self.database = database
        database.add_migrations("document_jobs", MIGRATIONS)
        self.ttl_s = ttl_s

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
            db.execute(f"INSERT INTO document_jobs ({COLUMNS}) VALUES ({marks})", astuple(job))
            put_file(db, job.job_id, "upload", content)
        return job

    def get(self, job_id: str) -> DocumentJob:
        if not self.database.exists():  # asking about a job creates no database
            raise NotFound(f"no document job with id {job_id!r}", "document_not_found")
        with self.database.read() as db:
            job = job_row(db, job_id)
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
        return bytes(row[0]) if row is not None else None

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
        return self.get(job_id)

    def sweep(self) -> int:
        """Delete finished jobs older than the TTL, rows and files; returns how many."""
        if not self.database.exists():
            return 0
        cutoff = time.time() - self.ttl_s
        with self.database.transaction() as db:
            expired = db.execute(
                "DELETE FROM document_jobs WHERE status NOT IN (?, ?) AND finished_at < ? "
                "RETURNING id",
                (*UNFINISHED, cutoff),
            ).fetchall()
        return len(expired)

    def close(self) -> None:
        self.database.close()


def job_row(db: Session, job_id: str) -> DocumentJob | None:
    row = db.execute(f"SELECT {COLUMNS} FROM document_jobs WHERE id = ?", (job_id,)).fetchone()
    return DocumentJob(*row) if row is not None else None


def put_file(db: Session, job_id: str, kind: str, content: bytes) -> None:
    db.execute(
        "INSERT INTO document_files (job_id, kind, content) VALUES (?, ?, ?) "
        "ON CONFLICT (job_id, kind) DO UPDATE SET content = excluded.content",
        (job_id, kind, content),
    )
