"""Document jobs: a file uploaded now, translated in the background, its progress polled and
its result downloaded later (``/v1/documents`` and DeepL's ``/v2/document``). The rows and
files are service/storage/documents.py's, how a job is claimed
service/storage/document_claims.py's; this module's runner claims queued jobs and translates
them.

Decisions:

* **Claimed, not handed.** Each of ``concurrency`` workers claims the oldest job it may (a
  job submitted through this process wakes them at once; one submitted elsewhere, or whose
  holder died, is found by polling every :data:`POLL_S`), so front-ends and replicas sharing
  a database share the queue and no job belongs to the process that happened to receive it.
* **Leases.** A claimed job is this runner's for ``lease_s``; the runner extends the lease
  every third of it and with every progress write. A replica that dies stops extending it and
  another claims the job once it runs out, starting it again (a half-done translation was
  never written). A runner that finds a job no longer its own (cancelled, or taken over while
  this replica could not reach the database) stops translating it. A runner that stops
  cleanly puts its jobs back in the queue, for the next claimer at once.
* **Interactive requests first.** At most ``concurrency`` documents at a time, each sent to
  the translator in small chunks (:data:`CHUNK_TEXTS`), one chunk in flight per job.
  Interactive requests arriving meanwhile join the batch beside a handful of document
  sentences instead of queueing behind hundreds. ``translate_for`` is the one seam to the
  translator.
* **Busy is not failed.** A chunk refused because the queue is full or the model is not
  ready (429, 503) is tried again after :data:`RETRY_S`; any other refusal fails the job
  with its message. The database being unreachable fails nothing: the job stays claimed
  until its lease runs out and is then taken up again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from service.errors import NotFound, ServiceError, StoreUnavailable
from service.storage.document_claims import DocumentClaims, process_holder
from service.storage.documents import DocumentJob, DocumentStore
from service.text.bulk import TranslateTexts
from service.text.files import TranslatedFile, translate_file
from service.text.segmenter import sentence_spans

logger = logging.getLogger(__name__)

CHUNK_TEXTS = 4  # texts per chunk: one chunk in flight per job
RETRY_S = 0.5  # wait before a chunk refused as busy (429/503) is tried again
POLL_S = 1.0  # how often an idle worker looks for jobs submitted elsewhere or left behind

# A job's texts in, their translations out (the web layer binds the dispatcher and the pair).
TranslatorFor = Callable[[DocumentJob], TranslateTexts]


def count_sentences(texts: list[str], language: str) -> int:
    """How many sentences the segmenter makes of ``texts`` (a text without one counts one)."""
    return sum(max(len(sentence_spans(text, language)), 1) for text in texts)


class LeaseLost(Exception):
    """The job is no longer this runner's: cancelled, or claimed by another replica."""


class DocumentRunner:
    """Claims jobs and translates up to ``concurrency`` at a time."""

    def __init__(
        self,
        store: DocumentStore,
        translate_for: TranslatorFor,
        concurrency: int,
        lease_s: float = 30.0,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.claims = DocumentClaims(store)
        self.translate_for = translate_for
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.holder = holder or process_holder()
        self._wake = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[None]] = {}

    @property
    def started(self) -> bool:
        return bool(self._workers)

    def start(self) -> None:
        """Start the workers and the lease keeper (what a previous run left translating is
        claimed again: at once on SQLite, once its lease runs out on PostgreSQL)."""
        self._wake = asyncio.Event()  # bound to this event loop
        self._workers = [
            asyncio.create_task(self._work(), name=f"document-worker-{n}")
            for n in range(self.concurrency)
        ]
        self._workers.append(asyncio.create_task(self._keep_leases(), name="document-leases"))

    def submit(self, job: DocumentJob) -> None:
        """A job was stored: wake an idle worker (any replica's claims it; this one's first)."""
        self._wake.set()

    def cancel(self, job_id: str) -> DocumentJob:
        job = self.store.cancel(job_id)
        if (task := self._running.get(job_id)) is not None:
            task.cancel()
        return job

    async def stop(self) -> None:
        """Stop translating: jobs in progress go back to the queue for the next claimer."""
        running = list(self._running)
        for task in [*self._workers, *self._running.values()]:
            task.cancel()
        for task in [*self._workers, *self._running.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for job_id in running:
            with contextlib.suppress(StoreUnavailable):  # then the lease runs out instead
                self.claims.release(job_id, self.holder)
        self._workers = []
        self._running = {}

    async def _work(self) -> None:
        while True:
            self._wake.clear()
            job = await self._claim()
            if job is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_S)
                continue
            task = asyncio.create_task(self._run(job), name=f"document-{job.job_id}")
            self._running[job.job_id] = task
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                # The job's own cancellation (its lease lost) ends the job, not the worker. A
                # cancellation of the worker ends it even when the job finished in the same
                # moment (task.done() then says nothing about who was cancelled).
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            finally:
                if task.done():
                    self._running.pop(job.job_id, None)

    async def _claim(self) -> DocumentJob | None:
        claiming = asyncio.ensure_future(
            asyncio.to_thread(self.claims.claim, self.holder, self.lease_s)
        )
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            # A cancelled wait does not stop the claim's thread: a job it takes after stop()
            # has listed the running ones goes back to the queue here, not left 'translating'
            # under this holder until its lease runs out.
            with contextlib.suppress(Exception):
                if (job := await claiming) is not None:
                    self.claims.release(job.job_id, self.holder)
            raise
        except StoreUnavailable as error:
            logger.warning("document jobs: %s", error.message)
        except Exception:  # a worker must outlive a bad moment of the database
            logger.exception("claiming a document job failed")
        return None

    async def _keep_leases(self) -> None:
        """Extend the lease of every running job; stop the ones that are no longer ours."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            for job_id, task in list(self._running.items()):
                try:
                    held = await asyncio.to_thread(
                        self.claims.renew, job_id, self.holder, self.lease_s
                    )
                except StoreUnavailable:
                    continue  # try again next time; the lease may run out meanwhile
                if not held:
                    logger.info("document job %s is no longer this replica's; stopping it", job_id)
                    task.cancel()

    async def _run(self, job: DocumentJob) -> None:
        job = replace(job, status="translating")
        claims, holder = self.claims, self.holder
        try:
            content = await asyncio.to_thread(self.store.upload, job)
            translated = await self._translate_off_loop(job, content)
            await asyncio.to_thread(
                claims.finish, job, holder, translated.filename, translated.content
            )
        except asyncio.CancelledError:
            raise
        except (LeaseLost, StoreUnavailable) as error:
            # Not this job's failure: its next holder (maybe this replica) starts it again.
            logger.warning("document job %s stopped here: %s", job.job_id, error)
        except NotFound as error:  # deleted meanwhile
            logger.info("document job %s: %s", job.job_id, error.message)
        except ServiceError as error:
            await asyncio.to_thread(claims.fail, job.job_id, holder, error.message)
        except Exception as error:  # a job's failure must not stop the runner
            logger.exception("document job %s failed", job.job_id)
            message = f"internal error ({type(error).__name__})"
            await asyncio.to_thread(claims.fail, job.job_id, holder, message)

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
                await self._progress(job, min(done, job.sentences_total))
            return out

        return translate_texts

    async def _progress(self, job: DocumentJob, sentences_done: int) -> None:
        try:
            held = await asyncio.to_thread(
                self.claims.progress, job.job_id, self.holder, sentences_done, self.lease_s
            )
        except StoreUnavailable:
            return  # progress is for the client's eyes; the lease keeper retries the lease
        if not held:
            raise LeaseLost(f"document job {job.job_id} is no longer this replica's")

    @staticmethod
    async def _busy_retried(translate: TranslateTexts, chunk: list[str]) -> list[str]:
        while True:
            try:
                return await translate(chunk)
            except ServiceError as error:
                if error.status not in (429, 503):
                    raise
            await asyncio.sleep(RETRY_S)
