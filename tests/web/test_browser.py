"""The web page in a real browser: Debian's Chromium driven by Playwright, against the real app on
a real socket with the tiny real model.

No browser is downloaded: Playwright launches ``/usr/bin/chromium`` (``.ci/run`` installs it
with apt), headless, sandbox and GPU off, no background networking, in a fresh context per test.
The test skips with a reason when the binary or Playwright is missing. Screenshots go to
``build/browser/`` (light and dark).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polib
import pytest

from service.config import Settings
from tests.live_server import live_server
from tests.service_fixtures import language_models

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "browser"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PO_FILE = b"""msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

#, python-format
msgid "Save %s files"
msgstr ""

msgid "Open the window"
msgstr ""
"""
LONG_TEXT = (
    "Save changes to the file. Open the window and close all files.\n"
    "Delete the folder. Search and replace in this window."
)

playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="no chromium binary (apt-get install chromium)"
    ),
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    # Three tiny models (en→de, de→en, en→fr): the page switches between real pairs.
    settings = Settings(
        exports=list(language_models(tmp_path_factory).values()),
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=32,
        files_dir=tmp_path_factory.mktemp("files"),
        data_dir=tmp_path_factory.mktemp("data"),
        frontend_timeout_ms=150,
    )
    with live_server(settings) as url:
        yield url


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One Chromium for the module: each test opens a context of its own in it (a start of the
    browser per test would cost more than most of the tests)."""
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def browser_page(browser: Any, locale: str = "en-US") -> Iterator[Any]:
    """A page in a fresh browser context (as a fresh profile: no storage, cookies or cache of
    another test) whose browser language is ``locale``."""
    context = browser.new_context(viewport={"width": 1200, "height": 720}, locale=locale)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def page(chromium):
    with browser_page(chromium) as opened:
        yield opened


def expected(
    base_url: str, text: str, source: str, target: str, key: str | None = None, **options
) -> str:
    body = {"text": text, "source_lang": source, "target_lang": target, **options}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(f"{base_url}v1/translate", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]["text"]


def wait_done(page) -> None:
    page.wait_for_function(
        "document.getElementById('text-status').textContent.startsWith('Done')", timeout=60_000
    )


def test_type_translate_switch_pair_stream_upload_a_po_file(base_url, page, tmp_path):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(base_url)
    page.wait_for_selector("body[data-ready=true]")
    assert page.input_value("#source-lang") == "auto"  # several sources: detect (LibreTranslate)
    page.select_option("#source-lang", "en")
    assert [
        o for o in page.eval_on_selector_all("#target-lang option", "os => os.map(o => o.value)")
    ] == ["de", "fr"]
    page.select_option("#target-lang", "de")
    assert "tiny-en-de" in page.text_content("#model-info")

    # Type: translated as you type, after the debounce.
    page.click("#source-text")
    page.keyboard.type("Save changes")
    wait_done(page)
    german = page.input_value("#target-text")
    assert german == expected(base_url, "Save changes", "en", "de")
    assert "model tiny-en-de" in page.text_content("#latency")

    # Switch the pair: en→fr is another model.
    page.select_option("#target-lang", "fr")
    wait_done(page)
    assert page.input_value("#target-text") == expected(base_url, "Save changes", "en", "fr")
    assert "model tiny-en-fr" in page.text_content("#latency")
    assert page.is_disabled("#swap")  # nothing translates fr→en

    # Swap: de→en, the German translation becomes the text to translate.
    page.select_option("#target-lang", "de")
    wait_done(page)
    page.click("#swap")
    wait_done(page)
    assert (page.input_value("#source-lang"), page.input_value("#target-lang")) == ("de", "en")
    assert page.input_value("#source-text") == german
    assert page.input_value("#target-text") == expected(base_url, german, "de", "en")

    # Detect the source language: the page says what was detected.
    page.select_option("#source-lang", "auto")
    page.select_option("#target-lang", "de")
    page.fill("#source-text", "Save changes")
    wait_done(page)
    assert page.input_value("#target-text") == expected(base_url, "Save changes", "auto", "de")
    assert "detected" in page.text_content("#text-status")

    # A long text is streamed sentence by sentence; the end result is the whole translation.
    page.select_option("#source-lang", "en")
    page.select_option("#target-lang", "de")
    page.select_option("#beam-size", "2")
    page.fill("#source-text", LONG_TEXT)
    wait_done(page)
    assert page.input_value("#target-text") == expected(
        base_url, LONG_TEXT, "en", "de", beam_size=2
    )
    assert "first sentence" in page.text_content("#latency")
    page.screenshot(path=str(SCREENSHOTS / "page.png"))

    # Files: upload a .po file as a document job; the progress bar follows the job's status
    # to the end and the page links to the translated file.
    page.click("#tab-files")
    assert page.is_visible("#file-input") and not page.is_visible("#source-text")
    assert not page.is_visible("#file-progress")
    po_path = tmp_path / "ui.po"
    po_path.write_bytes(PO_FILE)
    page.set_input_files("#file-input", str(po_path))
    page.click("#file-submit")
    page.wait_for_selector("#file-download:not([hidden])", timeout=60_000)
    assert page.is_visible("#file-progress")
    assert page.evaluate("document.getElementById('file-progress').value") == 1
    assert "(2 sentences)" in page.text_content("#file-status")
    link = page.get_attribute("#file-download", "href")
    assert "/v1/documents/" in link and link.endswith("/result")
    catalog = polib.pofile(httpx.get(link, timeout=30).text)
    assert catalog.find("Save %s files").msgstr == expected(base_url, "Save %s files", "en", "de")
    assert all("fuzzy" in entry.flags for entry in catalog if entry.msgstr)
    page.screenshot(path=str(SCREENSHOTS / "files.png"))
    # A corrupt document is refused with the server's message, and no bar is left behind.
    broken = tmp_path / "broken.docx"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    page.set_input_files("#file-input", str(broken))
    page.click("#file-submit")
    page.wait_for_selector("#file-status.error", timeout=30_000)
    assert "corrupt" in page.text_content("#file-status")
    assert not page.is_visible("#file-progress")

    # Dark mode, by the toggle; the choice is remembered.
    page.click("#tab-text")
    page.click("#theme-toggle")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.screenshot(path=str(SCREENSHOTS / "page-dark.png"))
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    assert errors == []


def test_keyboard_reaches_every_control_and_tabs_follow_the_arrow_keys(base_url, page):
    page.goto(base_url)
    page.wait_for_selector("body[data-ready=true]")
    for control in page.query_selector_all("select, textarea, input"):
        control_id = control.get_attribute("id")
        assert page.query_selector(f'label[for="{control_id}"]'), f"#{control_id} has no label"
    page.focus("#tab-text")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == "tab-files"
    assert page.is_visible("#file-input")
    page.keyboard.press("ArrowLeft")
    assert page.is_visible("#source-text")


@pytest.fixture(scope="module")
def keyed_url(tmp_path_factory):
    # API keys on, from a keys file: every request the page makes needs the key.
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    keys_file.write_text(json.dumps({"k1": {}}))
    settings = Settings(
        exports=[language_models(tmp_path_factory)[("en", "de")]],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=32,
        files_dir=tmp_path_factory.mktemp("keyed_files"),
        data_dir=tmp_path_factory.mktemp("keyed_data"),
        frontend_timeout_ms=150,
        api_keys_file=keys_file,
    )
    with live_server(settings) as url:
        yield url


def wait_error(page, message: str) -> None:
    page.wait_for_function(
        f"document.getElementById('text-status').textContent.includes({message!r})",
        timeout=60_000,
    )
    assert "error" in page.get_attribute("#text-status", "class")


def test_the_api_key_is_asked_for_kept_and_sent_and_a_failure_clears_the_translation(
    keyed_url, page, tmp_path
):
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(keyed_url)
    page.wait_for_selector("body[data-ready=true]")
    assert page.is_visible("#api-key")
    # No key yet: the server's refusal is shown, and no translation.
    page.click("#source-text")
    page.keyboard.type("Save changes")
    wait_error(page, "API key")
    assert page.input_value("#target-text") == ""
    # The key typed on the page goes with the request.
    page.fill("#api-key", "k1")
    wait_done(page)
    german = expected(keyed_url, "Save changes", "en", "de", key="k1")
    assert page.input_value("#target-text") == german
    # A failed request clears the translation: it is not this request's answer.
    page.fill("#api-key", "not-a-key")
    wait_error(page, "Invalid API key")
    assert page.input_value("#target-text") == ""
    # The key is kept in the browser (localStorage), as LibreTranslate's page keeps it.
    page.fill("#api-key", "k1")
    wait_done(page)
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.input_value("#api-key") == "k1"

    # A document job with the key: submitted, followed and downloaded with it.
    page.click("#tab-files")
    po_path = tmp_path / "ui.po"
    po_path.write_bytes(PO_FILE)
    page.set_input_files("#file-input", str(po_path))
    page.click("#file-submit")
    page.wait_for_selector("#file-download:not([hidden])", timeout=60_000)
    with page.expect_download() as download:
        page.click("#file-download")
    catalog = polib.pofile(Path(download.value.path()).read_text())
    translation = expected(keyed_url, "Open the window", "en", "de", key="k1")
    assert catalog.find("Open the window").msgstr == translation
    assert errors == []


def test_cancel_stops_a_document_job_and_the_page_says_so(base_url, page, tmp_path):
    # One document job runs at a time (MT_DOCUMENT_JOBS=1): while a long one runs, the
    # page's job waits in the queue, so Cancel finds it unfinished.
    lines = "\n".join(f"Save the file and open window {n}." for n in range(3000))
    blocker = httpx.post(
        f"{base_url}v1/documents",
        files={"file": ("long.txt", lines.encode())},
        data={"source_lang": "en", "target_lang": "de"},
        timeout=60,
    )
    assert blocker.status_code == 202, blocker.text
    try:
        page.goto(base_url)
        page.wait_for_selector("body[data-ready=true]")
        page.select_option("#source-lang", "en")
        page.select_option("#target-lang", "de")
        page.click("#tab-files")
        assert not page.is_visible("#file-cancel")
        po_path = tmp_path / "ui.po"
        po_path.write_bytes(PO_FILE)
        page.set_input_files("#file-input", str(po_path))
        page.click("#file-submit")
        page.wait_for_selector("#file-cancel:not([hidden])", timeout=30_000)
        assert "waiting" in page.text_content("#file-status")
        with page.expect_response(lambda r: r.request.method == "DELETE") as deleted:
            page.click("#file-cancel")
        assert deleted.value.status == 200
        page.wait_for_function(
            "document.getElementById('file-status').textContent.startsWith('Cancelled')",
            timeout=30_000,
        )
        assert not page.is_visible("#file-cancel")
        assert not page.is_visible("#file-progress")
        assert not page.is_visible("#file-download")
        job = httpx.get(deleted.value.url, timeout=30).json()
        assert job["status"] == "cancelled"
    finally:
        httpx.delete(f"{base_url}v1/documents/{blocker.json()['id']}", timeout=30)


def test_the_default_target_is_the_browsers_language_never_the_detected_source(base_url, chromium):
    with browser_page(chromium, locale="fr-FR") as page:
        page.goto(base_url)
        page.wait_for_selector("body[data-ready=true]")
        assert page.input_value("#source-lang") == "auto"
        assert page.input_value("#target-lang") == "fr"  # the browser's language
    with browser_page(chromium, locale="en-US") as page:
        page.goto(base_url)
        page.wait_for_selector("body[data-ready=true]")
        assert page.input_value("#target-lang") == "en"  # served (de→en): the default
        page.fill("#source-text", "Save changes")
        wait_done(page)
        # Detected English: English to English would give the text back, so the page picks
        # another target and translates into it.
        target = page.input_value("#target-lang")
        assert target != "en"
        assert "detected English" in page.text_content("#text-status")
        translated = page.input_value("#target-text")
        assert translated == expected(base_url, "Save changes", "en", target)
        assert translated != "Save changes"
