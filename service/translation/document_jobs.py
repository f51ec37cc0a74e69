"""Document jobs: a file uploaded now, translated in the background, its progress polled and
its result downloaded later (``/v1/documents`` and DeepL's ``/v2/document``).

Decisions:

* **Kept across restarts.** A job's row lives in SQLite (``documents.sqlite3`` under
  ``MT_DATA_DIR``) and its upload in a file beside it (``documents/<id>/upload``), written
  to a temporary name, flushed and renamed before the row that names it is committed. A
  restart finds the jobs that were queued or translating and queues them again from the
  start: the upload is there, and a half-done translation was never written.
* **Nothing half-written is served.** The result is written to a temporary name, flushed
  and renamed into place; only then does the row say ``done``, and only a ``done`` row's
  result is served.
* **Interactive requests first.** The runner translates at most ``concurrency`` documents
  at a time, and each document's texts go to the translator in small chunks
  (:data:`CHUNK_TEXTS`), one chunk in flight per job. Interactive requests arriving
  meanwhile join the batch beside a handful of document sentences instead of queueing
  behind hundreds. ``translate_for`` is the one seam to the translator: a batcher with a
  background priority class is reached there without changing this module.
* **Busy is not failed.** A chunk refused because the queue is full or the model is not
  ready (429, 503) is tried again after :data:`RETRY_S`; any other refusal fails the job
  with its message.
* **Progress in sentences** (as the segmenter splits the texts), with an estimate of the
  time left from the rate so far.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import astuple, dataclass, replace
from pathlib import Path

from service.errors import NotFound, ServiceError
from service.text.bulk import TranslateTexts
from service.text.files import TranslatedFile, translate_file
from service.text.segmenter import sentence_spans

logger = logging.getLogger(__name__)

CHUNK_TEXTS = 4  # texts per chunk: one chunk in flight per job
RETRY_S = 0.5  # wait before a chunk refused as busy (429/503) is tried again
UNFINISHED = ("queued", "translating")

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
    finished_at REAL
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

    def unfinished(self) -> list[DocumentJob]:
        """Jobs a restart must take up again, oldest first (none before the first job: a
        server that is never sent a document creates no database)."""
        if not self._exists():
            return []
        with self._lock:
            rows = self._db().execute(
                f"SELECT {_COLUMNS} FROM document_jobs WHERE status IN (?, ?) "
                "ORDER BY created_at, id",
                UNFINISHED,
            )
            return [DocumentJob(*row) for row in rows]

    def upload(self, job: DocumentJob) -> bytes:
        return (self._files(job.job_id) / "upload").read_bytes()

    def result_path(self, job: DocumentJob) -> Path | None:
        """The finished document, only for a job whose row says done."""
        if job.status != "done":
            return None
        path = self._files(job.job_id) / "result"
        return path if path.is_file() else None

    def _update(self, job_id: str, only_unfinished: bool, **fields: object) -> bool:
        assignments = ", ".join(f"{name} = ?" for name in fields)
        condition = f" AND status IN {UNFINISHED!r}" if only_unfinished else ""
        with self._lock, self._db() as db:
            changed = db.execute(
                f"UPDATE document_jobs SET {assignments} WHERE id = ?{condition}",
                (*fields.values(), job_id),
            ).rowcount
        return bool(changed)

    def start(self, job_id: str) -> None:
        self._update(job_id, True, status="translating", sentences_done=0, started_at=time.time())

    def requeue(self, job_id: str) -> None:
        """Back to the queue (the server stops): the next start translates it again."""
        self._update(job_id, True, status="queued", sentences_done=0, started_at=None)

    def progress(self, job_id: str, sentences_done: int) -> None:
        self._update(job_id, True, sentences_done=sentences_done)

    def finish(self, job: DocumentJob, result_name: str, content: bytes) -> None:
        """Write the result whole, then say done (unless the job was cancelled meanwhile)."""
        _write_atomically(self._files(job.job_id) / "result", content)
        self._update(
            job.job_id,
            True,
            status="done",
            sentences_done=job.sentences_total,
            result_name=result_name,
            finished_at=time.time(),
        )

    def fail(self, job_id: str, message: str) -> None:
        self._update(job_id, True, status="error", error=message, finished_at=time.time())

    def cancel(self, job_id: str) -> DocumentJob:
        """Cancel an unfinished job and delete its files; a finished one's files go too (the
        client is done with them; a done job reads ``deleted``, as /result's 410 says)."""
        job = self.get(job_id)
        if job.status in UNFINISHED:
            self._update(job_id, True, status="cancelled", finished_at=time.time())
        elif job.status == "done":
            self._update(job_id, False, status="deleted")
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


# A job's texts in, their translations out (the web layer binds the dispatcher and the pair).
TranslatorFor = Callable[[DocumentJob], TranslateTexts]


class DocumentRunner:
    """Takes queued jobs one by one and translates up to ``concurrency`` at a time."""

    def __init__(
        self, store: DocumentStore, translate_for: TranslatorFor, concurrency: int
    ) -> None:
        self.store = store
        self.translate_for = translate_for
        self.concurrency = concurrency
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[None]] = {}

    @property
    def started(self) -> bool:
        return bool(self._workers)

    def start(self) -> None:
        """Queue the jobs a previous run left unfinished, then start the workers."""
        self._queue = asyncio.Queue()  # bound to this event loop
        for job in self.store.unfinished():
            self.store.requeue(job.job_id)
            self._queue.put_nowait(job.job_id)
        self._workers = [
            asyncio.create_task(self._work(), name=f"document-worker-{n}")
            for n in range(self.concurrency)
        ]

    def submit(self, job: DocumentJob) -> None:
        self._queue.put_nowait(job.job_id)

    def cancel(self, job_id: str) -> DocumentJob:
        job = self.store.cancel(job_id)
        if (task := self._running.get(job_id)) is not None:
            task.cancel()
        return job

    async def stop(self) -> None:
        """Stop translating: jobs in progress go back to the queue for the next start."""
        running = list(self._running)
        for task in [*self._workers, *self._running.values()]:
            task.cancel()
        for task in [*self._workers, *self._running.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for job_id in running:
            self.store.requeue(job_id)
        self._workers = []

    async def _work(self) -> None:
        while True:
            job_id = await self._queue.get()
            try:
                job = self.store.get(job_id)
            except NotFound:
                continue  # swept meanwhile
            if job.status != "queued" or job_id in self._running:
                continue  # cancelled while it waited, or queued twice
            self.store.start(job_id)
            task = asyncio.create_task(self._run(job), name=f"document-{job_id}")
            self._running[job_id] = task
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # the worker itself is stopping
                    raise
            finally:
                if task.done():
                    self._running.pop(job_id, None)

    async def _run(self, job: DocumentJob) -> None:
        job = replace(job, status="translating")
        try:
            content = await asyncio.to_thread(self.store.upload, job)
            translated = await self._translate_off_loop(job, content)
            await asyncio.to_thread(self.store.finish, job, translated.filename, translated.content)
        except asyncio.CancelledError:
            raise
        except ServiceError as error:
            self.store.fail(job.job_id, error.message)
        except Exception as error:  # a job's failure must not stop the runner
            logger.exception("document job %s failed", job.job_id)
            self.store.fail(job.job_id, f"internal error ({type(error).__name__})")

    async def _translate_off_loop(self, job: DocumentJob, content: bytes) -> TranslatedFile:
        """Parse and write the document in a worker thread (a long document takes the CPU
        for a while, which must not delay interactive requests on the event loop); its texts
        come back to this loop, chunk by chunk, for the translator."""
        loop = asyncio.get_running_loop()
        translate = self._chunked(job)
        stopped = threading.Event()
        in_flight: list[concurrent.futures.Future[list[str]]] = []

        async def from_thread(texts: list[str]) -> list[str]:
            if stopped.is_set():
                raise asyncio.CancelledError

            async def call() -> list[str]:
                return await translate(texts)

            future = asyncio.run_coroutine_threadsafe(call(), loop)
            in_flight.append(future)
            try:
                return await asyncio.wrap_future(future)
            finally:
                in_flight.remove(future)

        def work() -> TranslatedFile:
            return asyncio.run(translate_file(job.filename, content, job.target_lang, from_thread))

        try:
            return await asyncio.to_thread(work)
        except asyncio.CancelledError:
            stopped.set()
            for future in list(in_flight):
                future.cancel()  # cancels the chunk's task on this loop
            raise

    def _chunked(self, job: DocumentJob) -> TranslateTexts:
        translate = self.translate_for(job)
        language = job.source_lang if job.source_lang != "auto" else "en"
        done = 0

        async def translate_texts(texts: list[str]) -> list[str]:
            nonlocal done
            out: list[str] = []
            for start in range(0, len(texts), CHUNK_TEXTS):
                chunk = texts[start : start + CHUNK_TEXTS]
                out += await self._busy_retried(translate, chunk)
                done += count_sentences(chunk, language)
                self.store.progress(job.job_id, min(done, job.sentences_total))
            return out

        return translate_texts

    @staticmethod
    async def _busy_retried(translate: TranslateTexts, chunk: list[str]) -> list[str]:
        while True:
            try:
                return await translate(chunk)
            except ServiceError as error:
                if error.status not in (429, 503):
                    raise
            await asyncio.sleep(RETRY_S)
