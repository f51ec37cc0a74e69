"""Document jobs: a file uploaded now, translated in the background, its progress polled and
its result downloaded later (``/v1/documents`` and DeepL's ``/v2/document``).

The rows and files, and how a job is claimed so that it runs once whichever front-end took
it, are service/translation/document_store.py's. This module translates them.

Decisions:

* **Interactive requests first.** The runner translates at most ``concurrency`` documents
  at a time, and each document's texts go to the translator in small chunks
  (:data:`CHUNK_TEXTS`), one chunk in flight per job. Interactive requests arriving
  meanwhile join the batch beside a handful of document sentences instead of queueing
  behind hundreds. ``translate_for`` is the one seam to the translator: a batcher with a
  background priority class is reached there without changing this module.
* **Any runner takes any job.** A runner queues the jobs it is given and looks every
  :data:`ADOPT_S` for jobs queued by another front-end or left by a process that died; a
  worker runs a job only once its claim in the store wins.
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
import threading
from collections.abc import Callable
from dataclasses import replace

from service.errors import NotFound, ServiceError
from service.text.bulk import TranslateTexts
from service.text.files import TranslatedFile, translate_file
from service.translation.document_store import (
    DocumentJob,
    DocumentStore,
    count_sentences,
    process_owner,
)

__all__ = ["DocumentJob", "DocumentRunner", "DocumentStore", "count_sentences"]

logger = logging.getLogger(__name__)

CHUNK_TEXTS = 4  # texts per chunk: one chunk in flight per job
RETRY_S = 0.5  # wait before a chunk refused as busy (429/503) is tried again
ADOPT_S = 2.0  # how often a runner looks for jobs it was not given


class JobLost(Exception):
    """The job's row is no longer this runner's to translate (cancelled, through any
    front-end): it stops without writing anything."""


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
        self.owner = process_owner()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()  # ids in the queue, each once
        self._workers: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[None]] = {}

    @property
    def started(self) -> bool:
        return bool(self._workers)

    def start(self) -> None:
        """Start the workers, and a look every :data:`ADOPT_S` for jobs any runner may take:
        those another front-end queued, or left when its process died (or a previous run)."""
        self._queue = asyncio.Queue()  # bound to this event loop
        self._queued.clear()
        self._workers = [
            asyncio.create_task(self._work(), name=f"document-worker-{n}")
            for n in range(self.concurrency)
        ]
        self._workers.append(asyncio.create_task(self._adopt(), name="document-adopter"))

    def submit(self, job: DocumentJob) -> None:
        if job.job_id not in self._queued:
            self._queued.add(job.job_id)
            self._queue.put_nowait(job.job_id)

    async def _adopt(self) -> None:
        while True:
            for job in await asyncio.to_thread(self.store.claimable):
                self.submit(job)
            await asyncio.sleep(ADOPT_S)

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
            self.store.release(job_id, self.owner)
        self._workers = []

    async def _work(self) -> None:
        while True:
            job_id = await self._queue.get()
            self._queued.discard(job_id)
            if job_id in self._running or not self.store.claim(job_id, self.owner):
                continue  # cancelled or swept while it waited, or another runner took it
            try:
                job = self.store.get(job_id)
            except NotFound:
                continue  # swept meanwhile
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
            await asyncio.to_thread(
                self.store.finish, job, self.owner, translated.filename, translated.content
            )
        except asyncio.CancelledError:
            raise
        except JobLost:
            logger.info("document job %s was cancelled elsewhere; stopped", job.job_id)
        except ServiceError as error:
            self.store.fail(job.job_id, self.owner, error.message)
        except Exception as error:  # a job's failure must not stop the runner
            logger.exception("document job %s failed", job.job_id)
            self.store.fail(job.job_id, self.owner, f"internal error ({type(error).__name__})")

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
                if not self.store.progress(job.job_id, self.owner, min(done, job.sentences_total)):
                    raise JobLost(job.job_id)
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
