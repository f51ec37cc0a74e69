"""Document jobs' rows in SQLite and their files beside it (``MT_DATA_DIR``): what
service/translation/document_jobs.py's runner takes, translates and finishes.

* **Kept across restarts.** A job's row lives in SQLite (``documents.sqlite3``) and its upload
  in a file beside it (``documents/<id>/upload``), written to a temporary name, flushed and
  renamed before the row that names it is committed.
* **Nothing half-written is served.** The result is written to a temporary name, flushed and
  renamed into place; only then does the row say ``done``, and only a ``done`` row's result
  is served.
* **A job runs once, whichever process took it.** Every front-end of the multi-process service
  opens the same file (WAL). A runner claims a queued job with one ``UPDATE ... WHERE status =
  'queued'`` that names it the owner (its process: boot, pid and start time, so a pid used
  again is another owner); SQLite serialises the writers, so one claim wins. Progress and the
  result are written only while the row is still the owner's. A job translating for an owner
  whose process is gone (killed, or a previous run) goes back to the queue, and from the start:
  the upload is there, and a half-done translation was never written.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
from dataclasses import astuple, dataclass
from functools import cache
from pathlib import Path

from service.errors import NotFound
from service.text.segmenter import sentence_spans

logger = logging.getLogger(__name__)

UNFINISHED = ("queued", "translating")
_OWNED = "status = ? AND owner = ?"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS document_jobs (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    filename TEXT NOT NULL,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    status TEXT NOT NULL,
    sentences_total INTEGER NOT NULL,
    sentences_done INTEGER NOT NULL,
    characters INTEGER NOT NULL,
    error TEXT,
    result_name TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    owner TEXT
);
"""
_COLUMNS = (
    "id, key, filename, source_lang, target_lang, status, sentences_total, sentences_done, "
    "characters, error, result_name, created_at, started_at, finished_at"
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

    def seconds_left(self, now: float) -> float | None:
        """The time left at the rate so far (None until a sentence is done)."""
        if self.status != "translating" or not self.started_at or self.sentences_done <= 0:
            return None
        rate = self.sentences_done / max(now - self.started_at, 1e-3)
        return max(self.sentences_total - self.sentences_done, 0) / rate


def count_sentences(texts: list[str], language: str) -> int:
    """How many sentences the segmenter makes of ``texts`` (a text without one counts one)."""
    return sum(max(len(sentence_spans(text, language)), 1) for text in texts)


def _write_atomically(path: Path, content: bytes) -> None:
    """``content`` at ``path`` whole or not at all: a temporary file, flushed, renamed."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


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
    """This process as a jobs' owner: ``boot/pid/start time``."""
    pid = os.getpid()
    return f"{_boot_id()}/{pid}/{_start_time(pid)}"


def owner_alive(owner: str | None) -> bool:
    """Whether the process ``owner`` names still runs (this machine's since this boot)."""
    if owner is None:
        return False
    boot, _, rest = owner.partition("/")
    pid, _, started = rest.partition("/")
    if boot != _boot_id() or not pid.isdigit():
        return False
    return _start_time(int(pid)) == started


class DocumentStore:
    """Job rows in SQLite and their files in ``directory`` (created on first use)."""

    def __init__(self, directory: Path, ttl_s: float) -> None:
        """``ttl_s``: finished jobs (and their files) older than this are deleted."""
        self.directory = Path(directory)
        self.ttl_s = ttl_s
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(
                self.directory / "documents.sqlite3", check_same_thread=False
            )
            # Progress is written from the event loop after every chunk: with a write-ahead
            # log and NORMAL sync a commit does not wait for the disk (a crash loses at most
            # the last progress counts; uploads and results are flushed files of their own).
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.executescript(_SCHEMA)
            columns = {row[1] for row in connection.execute("PRAGMA table_info(document_jobs)")}
            if "owner" not in columns:  # a database from before jobs had owners
                connection.execute("ALTER TABLE document_jobs ADD COLUMN owner TEXT")
            self._connection = connection
        return self._connection

    def _files(self, job_id: str) -> Path:
        return self.directory / "documents" / job_id

    def create(
        self,
        filename: str,
        content: bytes,
        source_lang: str,
        target_lang: str,
        sentences: int,
        characters: int,
    ) -> DocumentJob:
        """Store the upload, then the row that names it: a job never names a missing file."""
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
        )
        files = self._files(job.job_id)
        files.mkdir(parents=True, exist_ok=True)
        _write_atomically(files / "upload", content)
        with self._lock:
            db = self._db()
            # The client is told 202 once this row is on the disk: this commit waits for it.
            db.execute("PRAGMA synchronous = FULL")
            try:
                with db:
                    self._insert(db, job)
            finally:
                db.execute("PRAGMA synchronous = NORMAL")
        return job

    @staticmethod
    def _insert(db: sqlite3.Connection, job: DocumentJob) -> None:
        # The dataclass's fields are the table's columns, in order.
        db.execute(
            f"INSERT INTO document_jobs ({_COLUMNS}) VALUES ({', '.join('?' * 14)})",
            astuple(job),
        )

    def _exists(self) -> bool:
        return self._connection is not None or (self.directory / "documents.sqlite3").exists()

    def get(self, job_id: str) -> DocumentJob:
        if not self._exists():  # asking about a job creates no database
            raise NotFound(f"no document job with id {job_id!r}", "document_not_found")
        with self._lock:
            row = (
                self._db()
                .execute(f"SELECT {_COLUMNS} FROM document_jobs WHERE id = ?", (job_id,))
                .fetchone()
            )
        if row is None:
            raise NotFound(f"no document job with id {job_id!r}", "document_not_found")
        return DocumentJob(*row)

    def claimable(self) -> list[DocumentJob]:
        """Jobs a runner may take, oldest first: the queued ones, and those translating for
        an owner that is gone (its process died), put back in the queue here (none before
        the first job: a server that is never sent a document creates no database)."""
        if not self._exists():
            return []
        with self._lock:
            rows = self._db().execute(
                f"SELECT {_COLUMNS}, owner FROM document_jobs WHERE status IN (?, ?) "
                "ORDER BY created_at, id",
                UNFINISHED,
            )
            found = [(DocumentJob(*row[:-1]), row[-1]) for row in rows]
        claimable = []
        for job, owner in found:
            if job.status == "translating":
                if owner_alive(owner):
                    continue
                self.release(job.job_id, owner)
            claimable.append(job)
        return claimable

    def upload(self, job: DocumentJob) -> bytes:
        return (self._files(job.job_id) / "upload").read_bytes()

    def result_path(self, job: DocumentJob) -> Path | None:
        """The finished document, only for a job whose row says done."""
        if job.status != "done":
            return None
        path = self._files(job.job_id) / "result"
        return path if path.is_file() else None

    def _update(self, job_id: str, condition: str, values: tuple, **fields: object) -> bool:
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self._lock, self._db() as db:
            changed = db.execute(
                f"UPDATE document_jobs SET {assignments} WHERE id = ? AND {condition}",
                (*fields.values(), job_id, *values),
            ).rowcount
        return bool(changed)

    def claim(self, job_id: str, owner: str) -> bool:
        """Take a queued job for ``owner``; False where it is not queued (another runner,
        in this process or another, took it first: one UPDATE decides, so a job runs once)."""
        return self._update(
            job_id,
            "status = 'queued'",
            (),
            status="translating",
            sentences_done=0,
            started_at=time.time(),
            owner=owner,
        )

    def release(self, job_id: str, owner: str | None) -> bool:
        """Back to the queue, from ``owner`` (stopping, or gone): translated again from the
        start by whichever runner claims it next."""
        return self._update(
            job_id,
            "status = 'translating' AND owner IS ?",
            (owner,),
            status="queued",
            sentences_done=0,
            started_at=None,
            owner=None,
        )

    def progress(self, job_id: str, owner: str, sentences_done: int) -> bool:
        """False where the job is not ``owner``'s to translate any more (cancelled)."""
        return self._update(job_id, _OWNED, ("translating", owner), sentences_done=sentences_done)

    def finish(self, job: DocumentJob, owner: str, result_name: str, content: bytes) -> None:
        """Write the result whole, then say done (unless the job was cancelled meanwhile)."""
        _write_atomically(self._files(job.job_id) / "result", content)
        self._update(
            job.job_id,
            _OWNED,
            ("translating", owner),
            status="done",
            sentences_done=job.sentences_total,
            result_name=result_name,
            finished_at=time.time(),
        )

    def fail(self, job_id: str, owner: str, message: str) -> None:
        self._update(
            job_id,
            _OWNED,
            ("translating", owner),
            status="error",
            error=message,
            finished_at=time.time(),
        )

    def cancel(self, job_id: str) -> DocumentJob:
        """Cancel an unfinished job and delete its files; a finished one's files go too (the
        client says it is done with them). The row stays so that status still answers."""
        job = self.get(job_id)
        if job.status in UNFINISHED:
            self._update(
                job_id, "status IN (?, ?)", UNFINISHED, status="cancelled", finished_at=time.time()
            )
        shutil.rmtree(self._files(job_id), ignore_errors=True)
        return self.get(job_id)

    def sweep(self) -> int:
        """Delete finished jobs older than the TTL, rows and files; returns how many."""
        cutoff = time.time() - self.ttl_s
        with self._lock:
            rows = self._db().execute(
                "SELECT id FROM document_jobs WHERE status NOT IN (?, ?) AND finished_at < ?",
                (*UNFINISHED, cutoff),
            )
            expired = [job_id for (job_id,) in rows]
        for job_id in expired:
            shutil.rmtree(self._files(job_id), ignore_errors=True)
        if expired:
            with self._lock, self._db() as db:
                db.executemany("DELETE FROM document_jobs WHERE id = ?", [(i,) for i in expired])
        return len(expired)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
