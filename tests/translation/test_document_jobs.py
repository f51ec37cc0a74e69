"""Document jobs (service/translation/document_jobs.py, /v1/documents, DeepL's /v2/document):
the runner with stand-in translators (progress, cancel, busy retry, failure, stop and resume),
then the API with the tiny model: a docx uploaded, polled and downloaded, checked against the
service's own /v1/translate of the same texts; a restart that finds unfinished jobs; bad
files refused at upload; and the official ``deepl`` client's ``translate_document``.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import threading
import time

import docx
import httpx
import openpyxl
import pptx
import pytest
from ebooklib import epub
from fastapi.testclient import TestClient
from markdown_it import MarkdownIt
from odf.opendocument import load as odf_load
from translate.storage import xliff, xliff2

from service.errors import InputTooLarge, QueueFull
from service.storage.document_claims import DocumentClaims, process_holder
from service.storage.sqlite import SqliteDatabase
from service.translation import document_jobs
from service.translation.document_jobs import DocumentRunner, DocumentStore
from service.wiring import create_app
from tests.servers import serving
from tests.text import test_documents as documents
from tests.text.test_documents import (
    XXE,
    XXE_XLIFF,
    assert_only_text_parts_changed,
    epub_bomb,
    replace_part,
    zip_bomb,
)
from tests.text.test_html_text import shout
from tests.web.test_webapi import (  # noqa: F401
    LIMITS,
    download,
    make_settings,
    model_dir,
    served,
    wait_ready,
)
from tests.web.test_webapi import translate_file as post_file

TEXT = "one.\ntwo.\nthree.\nfour.\nfive.\nsix.\nseven.\neight.\nnine.\nten.\n"


def sqlite_store(data_dir) -> DocumentStore:
    """The store as one process keeps it under MT_DATA_DIR."""
    return DocumentStore(SqliteDatabase(data_dir / "documents.sqlite3", write_ahead_log=True), 3600)


def store_with_job(tmp_path, content: bytes = TEXT.encode(), name: str = "notes.txt"):
    store = sqlite_store(tmp_path / "data")
    job = store.create(name, content, "en", "de", sentences=10, characters=len(content))
    return store, job


async def finish(runner: DocumentRunner, job_id: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = runner.store.get(job_id).status
        if status not in ("queued", "translating"):
            return status
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} never finished")


# --- the runner --------------------------------------------------------------------------------


def test_runner_translates_in_small_chunks_one_at_a_time_and_reports_progress(tmp_path):
    store, job = store_with_job(tmp_path)
    seen: list[tuple[int, int]] = []  # (chunk size, chunks in flight)
    in_flight = 0

    def translate_for(_job):
        async def translate(texts: list[str]) -> list[str]:
            nonlocal in_flight
            in_flight += 1
            seen.append((len(texts), in_flight))
            progress = store.get(job.job_id)
            assert progress.status == "translating" and store.result(progress) is None
            await asyncio.sleep(0.01)
            in_flight -= 1
            return await shout(texts)

        return translate

    async def main() -> None:
        runner = DocumentRunner(store, translate_for, concurrency=1)
        runner.start()
        assert await finish(runner, job.job_id) == "done"
        await runner.stop()

    asyncio.run(main())
    assert [size for size, _ in seen] == [4, 4, 2]  # CHUNK_TEXTS, one chunk in flight
    assert all(flight == 1 for _, flight in seen)
    done = store.get(job.job_id)
    assert (done.sentences_done, done.sentences_total) == (10, 10)
    assert store.result(done).decode() == TEXT.upper()
    assert store.upload(done) == TEXT.encode()  # the upload stays beside the result


def test_a_busy_translator_is_retried_and_a_refusal_fails_the_job(tmp_path, monkeypatch):
    monkeypatch.setattr(document_jobs, "RETRY_S", 0.01)
    store, busy_job = store_with_job(tmp_path)
    refused_job = store.create("b.txt", b"too long\n", "en", "de", 1, 8)
    calls = {"busy": 0}

    def translate_for(job):
        async def translate(texts: list[str]) -> list[str]:
            if job.job_id == refused_job.job_id:
                raise InputTooLarge("too_long", "a sentence is over the token limit")
            calls["busy"] += 1
            if calls["busy"] <= 2:
                raise QueueFull("the queue is full")
            return await shout(texts)

        return translate

    async def main() -> None:
        runner = DocumentRunner(store, translate_for, concurrency=2)
        runner.start()
        assert await finish(runner, busy_job.job_id) == "done"
        assert await finish(runner, refused_job.job_id) == "error"
        await runner.stop()

    asyncio.run(main())
    assert calls["busy"] == 2 + 3  # two refusals, then the three chunks
    failed = store.get(refused_job.job_id)
    assert failed.error == "a sentence is over the token limit"
    assert store.result(failed) is None


def test_cancel_stops_a_translating_job_and_serves_nothing(tmp_path):
    store, job = store_with_job(tmp_path)
    entered: list[int] = []

    def translate_for(_job):
        async def translate(texts: list[str]) -> list[str]:
            entered.append(len(texts))
            await asyncio.sleep(3600)  # until cancelled
            return texts

        return translate

    async def main() -> None:
        runner = DocumentRunner(store, translate_for, concurrency=1)
        runner.start()
        while not entered:
            await asyncio.sleep(0.01)
        cancelled = runner.cancel(job.job_id)
        assert cancelled.status == "cancelled"
        await asyncio.sleep(0.05)
        assert not runner._running  # the job's task ended
        await runner.stop()

    asyncio.run(main())
    assert entered == [4]  # no chunk after the cancel
    final = store.get(job.job_id)
    assert final.status == "cancelled" and store.result(final) is None
    with pytest.raises(Exception, match="upload .* is gone"):  # its files were deleted
        store.upload(final)


def test_a_worker_cancelled_as_its_job_finishes_stops(tmp_path):
    """A worker that stop() cancels in the moment its job finishes wakes cancelled with its job
    done: it must stop, not take the cancellation for its job's and go on claiming (stop()
    would then wait for it forever)."""
    store, _job = store_with_job(tmp_path)

    async def main() -> None:
        runner = DocumentRunner(store, lambda _job: shout, concurrency=1)

        async def cancel_the_worker_and_finish(_claimed) -> None:
            for worker in runner._workers[:-1]:  # the last task keeps the leases
                worker.cancel()

        runner._run = cancel_the_worker_and_finish  # type: ignore[method-assign]
        runner.start()
        worker = runner._workers[0]
        done, _ = await asyncio.wait([worker], timeout=2.0)
        assert worker in done and worker.cancelled()
        await asyncio.wait_for(runner.stop(), 5.0)

    asyncio.run(main())


def never_done(_job):
    """A job's translator that never finishes (its runner is stopped while it translates)."""

    async def translate(texts: list[str]) -> list[str]:
        await asyncio.sleep(3600)
        return texts

    return translate


def test_stopped_jobs_are_taken_up_again_by_the_next_runner(tmp_path):
    store, job = store_with_job(tmp_path)

    def shouting(_job):
        return shout

    async def first_run() -> None:
        runner = DocumentRunner(store, never_done, concurrency=1)
        runner.start()
        while store.get(job.job_id).status != "translating":
            await asyncio.sleep(0.01)
        await runner.stop()

    async def second_run() -> None:
        runner = DocumentRunner(store, shouting, concurrency=1)
        runner.start()
        assert await finish(runner, job.job_id) == "done"
        await runner.stop()

    asyncio.run(first_run())
    assert store.get(job.job_id).status == "queued"
    store.close()
    store = sqlite_store(tmp_path / "data")  # a new process
    asyncio.run(second_run())
    assert store.result(store.get(job.job_id)).decode() == TEXT.upper()


def test_a_job_claimed_while_the_runner_stops_goes_back_to_the_queue(tmp_path):
    # stop() cancels a worker whose claim is still in its thread: the thread claims the job
    # after stop() has listed the running ones, and the job must not stay 'translating'.
    store, job = store_with_job(tmp_path)
    in_claim, claim_may_go = threading.Event(), threading.Event()

    async def stop_during_the_claim() -> None:
        runner = DocumentRunner(store, never_done, concurrency=1)
        claim = runner.claims.claim

        def held_claim(holder: str, lease_s: float):
            in_claim.set()
            claim_may_go.wait(10)
            return claim(holder, lease_s)

        runner.claims.claim = held_claim  # type: ignore[method-assign]
        runner.start()
        await asyncio.to_thread(in_claim.wait, 10)
        stopping = asyncio.create_task(runner.stop())
        await asyncio.sleep(0.05)  # the worker is cancelled while its claim waits
        claim_may_go.set()
        await stopping

    asyncio.run(stop_during_the_claim())
    assert store.get(job.job_id).status == "queued"


def test_two_runners_on_one_store_run_each_job_exactly_once(tmp_path, monkeypatch):
    # Two front-ends, each its own connection to the one SQLite file; the second starts (or
    # restarts) while the first translates: it takes queued jobs, never the first's.
    monkeypatch.setattr(document_jobs, "POLL_S", 0.01)
    stores = [sqlite_store(tmp_path / "data") for _ in range(2)]
    jobs = [
        stores[0].create(f"{n}.txt", f"text {n}.\n".encode(), "en", "de", 1, 8) for n in range(6)
    ]
    runs: list[str] = []

    def counting(job):
        runs.append(job.job_id)  # once per run of a job

        async def translate(texts: list[str]) -> list[str]:
            await asyncio.sleep(0.05)
            return [text.upper() for text in texts]

        return translate

    async def run() -> None:
        first = DocumentRunner(stores[0], counting, concurrency=2)
        first.start()
        for job in jobs:
            first.submit(job)
        # Until the first runner has taken a job (it may have finished some already).
        deadline = time.monotonic() + 30
        while not any(stores[1].get(job.job_id).status != "queued" for job in jobs):
            assert time.monotonic() < deadline, "the first runner took no job"
            await asyncio.sleep(0.005)
        second = DocumentRunner(stores[1], counting, concurrency=2)
        second.start()
        for job in jobs:
            assert await finish(first, job.job_id) == "done"
        await first.stop()
        await second.stop()

    asyncio.run(run())
    assert sorted(runs) == sorted(job.job_id for job in jobs)


def dead_process_holder() -> str:
    """The holder id of a process of this machine that has exited."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    return process_holder().split("/")[0] + f"/{child.stdout.strip()}/0"


def test_a_job_of_a_dead_process_is_taken_up_and_a_live_ones_is_left(tmp_path):
    store, held = store_with_job(tmp_path)
    orphaned = store.create("orphan.txt", TEXT.encode(), "en", "de", sentences=10, characters=5)
    # Both under a long lease: one translating here, in another runner of this process...
    assert DocumentClaims(store).claim(process_holder(), lease_s=3600).job_id == held.job_id
    # ...and one translating when its process was killed.
    assert (
        DocumentClaims(store).claim(dead_process_holder(), lease_s=3600).job_id == orphaned.job_id
    )

    async def run() -> None:
        runner = DocumentRunner(store, lambda _job: shout, concurrency=1)
        runner.start()
        assert await finish(runner, orphaned.job_id) == "done"
        await asyncio.sleep(0.1)
        await runner.stop()

    asyncio.run(run())
    assert store.result(store.get(orphaned.job_id)).decode() == TEXT.upper()
    assert store.get(held.job_id).status == "translating"  # left to its live holder


def test_a_job_cancelled_through_another_front_end_stops_and_writes_nothing(tmp_path):
    store, job = store_with_job(tmp_path)
    elsewhere = sqlite_store(tmp_path / "data")

    def slow(_job):
        async def translate(texts: list[str]) -> list[str]:
            await asyncio.sleep(0.05)
            return texts

        return translate

    async def run() -> None:
        runner = DocumentRunner(store, slow, concurrency=1)
        runner.start()
        while store.get(job.job_id).sentences_done == 0:
            await asyncio.sleep(0.01)
        elsewhere.cancel(job.job_id)
        while runner._running:
            await asyncio.sleep(0.01)
        await runner.stop()

    asyncio.run(run())
    final = store.get(job.job_id)
    assert final.status == "cancelled" and store.result(final) is None


def test_finished_jobs_past_their_ttl_are_swept_with_their_files(tmp_path):
    store, job = store_with_job(tmp_path)
    assert DocumentClaims(store).claim("replica-a", lease_s=30).job_id == job.job_id
    DocumentClaims(store).fail(job.job_id, "replica-a", "boom")
    store.ttl_s = 0.0
    assert store.sweep() == 1
    with store.database.read() as db:  # the files went with the row
        assert db.execute("SELECT COUNT(*) FROM document_files").fetchone()[0] == 0
    with pytest.raises(Exception, match="no document job"):
        store.get(job.job_id)


# --- the API with the tiny model ---------------------------------------------------------------


def build_docx() -> bytes:
    document = docx.Document()
    document.add_paragraph("Save the file")
    formatted = document.add_paragraph("Open ")
    formatted.add_run("the window").bold = True
    document.sections[0].header.paragraphs[0].text = "Close all files"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@pytest.fixture()
def app_settings(model_dir, tmp_path):  # noqa: F811
    return make_settings(model_dir, tmp_path, data_dir=tmp_path / "data")


def poll(client: TestClient, job_id: str) -> dict:
    for _ in range(2000):
        status = client.get(f"/v1/documents/{job_id}").json()
        if status["status"] not in ("queued", "translating"):
            return status
        time.sleep(0.01)
    raise AssertionError(f"the job never finished: {status}")


@pytest.fixture(scope="module")
def documents_client(process_mode, model_dir, tmp_path_factory):  # noqa: F811
    """The service in each process mode, for the document APIs (the Markdown test document's
    first paragraph is one long sentence)."""
    workdir = tmp_path_factory.mktemp("documents")
    settings = dict(LIMITS, exports=[model_dir], files_dir=workdir / "files", max_input_tokens=128)
    with serving(process_mode, workdir, **settings) as served:
        yield served.client


def test_document_job_upload_progress_and_result(documents_client):
    source = build_docx()
    client = documents_client
    created = client.post(
        "/v1/documents",
        data={"source_lang": "en", "target_lang": "de"},
        files={"file": ("report.docx", source)},
    )
    assert created.status_code == 202, created.text
    body = created.json()
    assert body["status"] == "queued" and body["sentences_total"] == 3
    done = poll(client, body["id"])
    assert done["status"] == "done", done
    assert (done["sentences_done"], done["progress"]) == (3, 1.0)
    result = client.get(f"/v1/documents/{body['id']}/result")
    assert result.status_code == 200
    assert "report.docx" in result.headers["content-disposition"]
    document = docx.Document(io.BytesIO(result.content))
    expected = served(client, ["Save the file", "Close all files"])
    assert document.paragraphs[0].text == expected[0]
    assert document.sections[0].header.paragraphs[0].text == expected[1]
    assert [bool(r.bold) for r in document.paragraphs[1].runs] == [False, True]
    assert_only_text_parts_changed(
        source, result.content, {"word/document.xml", "word/header1.xml"}
    )
    gone = client.delete(f"/v1/documents/{body['id']}")
    assert gone.status_code == 200 and gone.json()["status"] == "deleted"
    # Its status says what its result's 410 says.
    status = client.get(f"/v1/documents/{body['id']}")
    assert status.status_code == 200 and status.json()["status"] == "deleted"
    assert status.json()["result_url"] is None
    assert client.get(f"/v1/documents/{body['id']}/result").status_code == 410
    assert client.get("/v1/documents/nope").status_code == 404


def test_a_restart_takes_up_jobs_left_unfinished(app_settings):
    # A previous process stored the upload and died before (or while) translating it.
    store = sqlite_store(app_settings.storage.data_dir)
    halfway = store.create("b.txt", b"Close the window\nOpen it\n", "en", "de", 2, 23)
    queued = store.create("a.txt", b"Save the file\n", "en", "de", 1, 13)
    # Claimed under a long lease by a process of this machine that died: on SQLite the next
    # start takes it up at once rather than after the lease.
    dead = dead_process_holder()
    assert DocumentClaims(store).claim(dead, lease_s=3600).job_id == halfway.job_id
    DocumentClaims(store).progress(halfway.job_id, dead, 1, lease_s=3600)
    store.close()
    with TestClient(create_app(app_settings)) as client:
        wait_ready(client)
        for job, texts in ((queued, ["Save the file"]), (halfway, ["Close the window", "Open it"])):
            assert poll(client, job.job_id)["status"] == "done"
            result = client.get(f"/v1/documents/{job.job_id}/result").content.decode()
            assert result.splitlines() == served(client, texts)


BAD_DOCUMENTS = [
    ("x.docx", lambda: replace_part(build_docx(), "word/document.xml", XXE), "entities"),
    ("x.xlsx", zip_bomb, "zip bomb"),
    ("x.docx", lambda: build_docx()[:3000], "corrupt"),
    ("x.epub", epub_bomb, "zip bomb"),
    ("x.xlf", lambda: XXE_XLIFF, "entities"),
    ("x.pdf", lambda: b"%PDF-1.4", "file format not supported"),
]


def _po(msgid: str) -> bytes:
    header = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
    return f'{header}msgid "{msgid}"\nmsgstr ""\n'.encode()


def test_documents_that_cannot_succeed_are_refused_at_upload_as_translate_file_does(
    app_settings,
):
    cases = [
        ({"target_lang": "zz"}, ("notes.txt", b"Save the file\n"), 400),  # auto source
        ({"target_lang": "de"}, ("ui.po", _po("a" * 5001)), 413),
        ({"target_lang": "de"}, ("notes.txt", ("word " * 1200).encode()), 413),
    ]
    with TestClient(create_app(app_settings)) as client:
        wait_ready(client)
        for data, upload, status in cases:
            job = client.post("/v1/documents", data=data, files={"file": upload})
            direct = client.post(
                "/translate_file",
                data={"source": "auto", "target": data["target_lang"]},
                files={"file": upload},
            )
            assert (job.status_code, direct.status_code) == (status, status), (
                upload[0],
                job.text,
                direct.text,
            )
        # Nothing queued: not even the jobs' database was created.
        assert not (app_settings.storage.data_dir / "documents.sqlite3").exists()


def test_bad_documents_are_refused_at_upload(app_settings):
    with TestClient(create_app(app_settings)) as client:
        wait_ready(client)
        for name, make, message in BAD_DOCUMENTS:
            response = client.post(
                "/v1/documents", data={"target_lang": "de"}, files={"file": (name, make())}
            )
            assert response.status_code == 400, (name, response.text)
            assert message in response.json()["error"], name
        # Nothing queued: not even the jobs' database was created.
        assert not (app_settings.storage.data_dir / "documents.sqlite3").exists()


def test_the_official_deepl_client_translates_a_document(model_dir, tmp_path, monkeypatch):  # noqa: F811
    deepl = pytest.importorskip("deepl")
    from tests.live_server import live_server

    # The client polls every 5 s; the wait is shortened, not the protocol.
    class QuickPolls:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(_seconds: float) -> None:
            time.sleep(0.05)

    monkeypatch.setattr(deepl.translator, "time", QuickPolls())
    settings = make_settings(model_dir, tmp_path, data_dir=tmp_path / "data", api_keys="k1")
    source = build_docx()
    with live_server(settings) as base:
        translator = deepl.Translator("k1", server_url=base.rstrip("/"))
        out = io.BytesIO()
        status = translator.translate_document(
            source, out, source_lang="EN", target_lang="DE", filename="r.docx"
        )
        billed = len("Save the file") + len("Open the window") + len("Close all files")
        assert status.done and status.billed_characters == billed
        reference = httpx.post(
            f"{base}v1/translate",
            json={"text": ["Save the file"], "source_lang": "en", "target_lang": "de"},
            headers={"Authorization": "Bearer k1"},
        )
        expected = reference.json()["translations"][0]["text"]
        assert docx.Document(io.BytesIO(out.getvalue())).paragraphs[0].text == expected
        handle = translator.translate_document_upload(source, target_lang="DE", filename="r.docx")
        assert translator.translate_document_get_status(handle).ok
        stranger = deepl.DocumentHandle(handle.document_id, "not-its-key")
        with pytest.raises(deepl.DeepLException, match="Not found"):
            translator.translate_document_get_status(stranger)


# --- every format through both APIs ------------------------------------------------------------


def opened(name: str, content: bytes) -> object:
    """``content`` opened by the library that reads its format (raises when it cannot)."""
    suffix = name.rsplit(".", 1)[1]
    data = io.BytesIO(content)
    readers = {
        "docx": docx.Document,
        "pptx": pptx.Presentation,
        "xlsx": openpyxl.load_workbook,
        "odt": odf_load,
        "odp": odf_load,
        "ods": odf_load,
        "epub": epub.read_epub,
        "xlf": lambda d: xliff.xlifffile.parsestring(d.read()),
        "xliff": lambda d: xliff2.Xliff2File.parsestring(d.read()),
        "md": lambda d: MarkdownIt("commonmark").parse(d.read().decode()),
    }
    return readers[suffix](data)


FORMATS = [
    ("a.docx", build_docx, {"word/document.xml", "word/header1.xml"}),
    ("b.pptx", documents.build_pptx, {"ppt/slides/slide1.xml", "ppt/notesSlides/notesSlide1.xml"}),
    ("c.odt", documents.build_odt, {"content.xml", "styles.xml"}),
    ("d.odp", documents.build_odp, {"content.xml"}),
    ("e.ods", documents.build_ods, {"content.xml"}),
    ("f.epub", documents.build_epub, {"EPUB/ch1.xhtml", "EPUB/nav.xhtml", "EPUB/toc.ncx"}),
    ("g.xlsx", documents.build_xlsx, None),  # openpyxl's inline strings: the sheets change
    ("h.xlf", lambda: documents.XLIFF_12, None),
    ("i.xliff", lambda: documents.XLIFF_20, None),
    ("j.md", lambda: documents.MARKDOWN.encode(), None),
]


def test_every_format_through_translate_file_and_document_jobs_alike(documents_client):
    client = documents_client
    for name, build, text_parts in FORMATS:
        source = build()
        _, synchronous = download(client, post_file(client, name, source))
        created = client.post(
            "/v1/documents",
            data={"source_lang": "en", "target_lang": "de"},
            files={"file": (name, source)},
        )
        assert created.status_code == 202, (name, created.text)
        job_id = created.json()["id"]
        assert poll(client, job_id)["status"] == "done", name
        background = client.get(f"/v1/documents/{job_id}/result").content
        # One model, the same texts: both APIs give the same document, byte for byte.
        assert background == synchronous, name
        assert source != background, name
        opened(name, background)
        if text_parts is not None:
            assert_only_text_parts_changed(source, background, text_parts)
