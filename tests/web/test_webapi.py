"""LibreTranslate's file translation, /frontend/settings, the web page and the offline API docs,
against the real app and the tiny real model (tests/service_fixtures.py).

Every translated file is checked against the service's own translation of the same texts
through ``/v1/translate``: the file path must add nothing and lose nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import polib
import pytest
import srt
from fastapi.testclient import TestClient

from service.config import Settings
from service.text.placeholders import surviving_placeholders
from service.wiring import create_app
from tests.service_fixtures import tiny_model

LIMITS = dict(
    max_texts_per_request=4,  # files hold more texts: they go in chunks
    max_chars_per_text=500,
    max_input_tokens=64,
    max_new_tokens=64,
    max_beam_size=4,
    alternatives_limit=2,
    max_body_bytes=64_000,
)

POT = r"""#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"

#: ui.py:1
#, python-format
msgid "Save %(count)d files to %s"
msgstr ""

#: ui.py:2
msgctxt "menu"
msgid "Open the window"
msgstr ""

#: ui.py:3
#, python-brace-format
msgid "Delete one file"
msgid_plural "Delete {n} files"
msgstr[0] ""
msgstr[1] ""

#: ui.py:4
msgid "Close all files"
msgstr ""

#: ui.py:5
msgid "Search and replace"
msgstr ""

#: ui.py:6
msgid "Already translated"
msgstr "Schon übersetzt"
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def make_settings(model_dir, tmp_path, **overrides) -> Settings:
    return Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        files_dir=tmp_path / "files",
        **{**LIMITS, **overrides},
    )


def wait_ready(client: TestClient) -> None:
    for _ in range(3000):
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError(f"never ready: {client.get('/ready').json()}")


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory):
    settings = make_settings(model_dir, tmp_path_factory.mktemp("webapi"))
    with TestClient(create_app(settings)) as test_client:
        wait_ready(test_client)
        yield test_client


def served(client: TestClient, texts: list[str]) -> list[str]:
    """The service's translation of ``texts`` through /v1/translate (the reference)."""
    out = []
    for start in range(0, len(texts), LIMITS["max_texts_per_request"]):
        response = client.post("/v1/translate", json={"text": texts[start : start + 4]})
        assert response.status_code == 200, response.text
        out += [t["text"] for t in response.json()["translations"]]
    return out


def translate_file(client: TestClient, name: str, content: bytes, **form) -> httpx.Response:
    data = {"source": "en", "target": "de", **form}
    return client.post("/translate_file", data=data, files={"file": (name, content)})


def download(client: TestClient, response: httpx.Response) -> tuple[str, bytes]:
    assert response.status_code == 200, response.text
    url = response.json()["translatedFileUrl"]
    assert url.startswith("http://testserver/download_file/")
    got = client.get(url)
    assert got.status_code == 200, got.text
    disposition = got.headers["content-disposition"]
    return disposition.split("filename=", 1)[1].strip('"'), got.content


# --- /translate_file ---------------------------------------------------------------------------


def test_pot_file_comes_back_as_a_valid_po_with_fuzzy_translations(client, tmp_path):
    name, content = download(client, translate_file(client, "demo.pot", POT.encode()))
    assert name == "demo.po"
    catalog = polib.pofile(content.decode())
    source = polib.pofile(POT)
    expected = served(
        client,
        [e.msgid for e in source if not e.msgstr and not e.msgstr_plural]
        + ["Delete one file", "Delete {n} files"],
    )
    untranslated = [e for e in source if not e.msgstr and not e.msgstr_plural]
    for entry, translation in zip(untranslated, expected, strict=False):
        got = catalog.find(entry.msgid, msgctxt=entry.msgctxt or False)
        assert got.msgstr == translation
        assert "fuzzy" in got.flags and set(entry.flags) <= set(got.flags)
    plural = catalog.find("Delete one file")
    assert plural.msgstr_plural == {0: expected[-2], 1: expected[-1]}
    assert catalog.find("Already translated").msgstr == "Schon übersetzt"
    for entry in catalog:
        if entry.msgstr:
            assert surviving_placeholders(entry.msgid, entry.msgstr) == (
                surviving_placeholders(entry.msgid, entry.msgid)
            )
    if shutil.which("msgfmt"):
        path = tmp_path / name
        path.write_bytes(content)
        checked = subprocess.run(
            ["msgfmt", "--check", "--use-fuzzy", "-o", "/dev/null", str(path)],
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0, checked.stderr


def test_txt_file_round_trips_line_by_line(client):
    lines = ["Save changes.", "", "Open the file and close the window.", "Delete all files"]
    name, content = download(client, translate_file(client, "notes.txt", "\n".join(lines).encode()))
    assert name == "notes.txt"
    expected = served(client, [line for line in lines if line])
    assert content.decode().split("\n") == [expected[0], "", expected[1], expected[2]]


def test_srt_file_keeps_its_timings(client):
    source = (
        "1\n00:00:01,000 --> 00:00:02,000\nSave the file\n\n"
        "2\n00:00:02,500 --> 00:00:04,000\nOpen the window\n\n"
    )
    name, content = download(client, translate_file(client, "clip.srt", source.encode()))
    subtitles = list(srt.parse(content.decode()))
    assert [(s.start, s.end) for s in subtitles] == [(s.start, s.end) for s in srt.parse(source)]
    assert [s.content for s in subtitles] == served(client, ["Save the file", "Open the window"])


def test_html_file_keeps_its_markup(client):
    html = "<html><body><h1>Settings</h1><p>Save <b>changes</b></p><pre>code</pre></body></html>"
    _, content = download(client, translate_file(client, "page.html", html.encode()))
    text = content.decode()
    assert text.startswith("<html><body><h1>") and "<pre>code</pre></body></html>" in text


@pytest.mark.parametrize(
    ("form", "files", "status", "error"),
    [
        ({"source": "en", "target": "de"}, None, 400, "Invalid request: missing file parameter"),
        ({"target": "de"}, ("a.txt", b"x"), 400, "Invalid request: missing source parameter"),
        ({"source": "en"}, ("a.txt", b"x"), 400, "Invalid request: missing target parameter"),
        (
            {"source": "en", "target": "de"},
            ("a.pdf", b"%PDF"),
            400,
            "Invalid request: file format not supported",
        ),
        (
            {"source": "en", "target": "de"},
            ("a.txt", "Grüße".encode("latin-1")),
            400,
            "not UTF-8",
        ),
    ],
)
def test_translate_file_refusals_use_libretranslate_texts(client, form, files, status, error):
    kwargs = {"files": {"file": files}} if files else {"files": {"other": ("x", b"")}}
    response = client.post("/translate_file", data=form, **kwargs)
    assert response.status_code == status, response.text
    assert error in response.json()["error"]


def test_download_refuses_names_it_did_not_hand_out(client):
    assert client.get("/download_file/..%2F..%2Fetc%2Fpasswd").status_code == 404
    response = client.get("/download_file/00000000-0000-0000-0000-000000000000.gone.txt")
    assert response.status_code == 404 and response.json()["error"] == "Invalid filename"


def test_file_translation_can_be_turned_off(model_dir, tmp_path):
    settings = make_settings(model_dir, tmp_path, files_translation=False)
    with TestClient(create_app(settings)) as off:
        response = translate_file(off, "a.txt", b"Save")
        assert response.status_code == 403
        assert response.json()["error"] == "Files translation are disabled on this server."
        body = off.get("/frontend/settings").json()
        assert body["filesTranslation"] is False and body["supportedFilesFormat"] == []


# --- /frontend/settings, the page, the docs ------------------------------------------------------


def test_frontend_settings_have_libretranslate_fields_and_our_limits(client):
    body = client.get("/frontend/settings").json()
    assert body == {
        "charLimit": 500,
        "frontendTimeout": 500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [
            *[".txt", ".html", ".htm", ".po", ".pot", ".srt"],
            *[".xlf", ".xliff", ".md", ".markdown"],
            *[".docx", ".pptx", ".xlsx", ".odt", ".odp", ".ods", ".epub"],
        ],
        "language": {
            "source": {"code": "en", "name": "English"},
            "target": {"code": "de", "name": "German"},
        },
        "maxBeamSize": 4,
        "defaultBeamSize": 1,
        "alternativesLimit": 2,
        "maxTextsPerRequest": 4,
        "maxBodyBytes": 64_000,
    }


@pytest.mark.parametrize("source", ["MT_API_KEYS", "MT_API_KEYS_FILE"])
def test_frontend_settings_say_when_api_keys_are_required(model_dir, tmp_path, source):
    if source == "MT_API_KEYS":
        keys = {"api_keys": "k1"}
    else:
        (tmp_path / "keys.json").write_text('{"k1": {"requests_per_minute": 10}}')
        keys = {"api_keys_file": tmp_path / "keys.json"}
    with TestClient(create_app(make_settings(model_dir, tmp_path, **keys))) as keyed:
        body = keyed.get("/frontend/settings").json()  # the page reads it before any key
        assert (body["apiKeys"], body["keyRequired"]) == (True, True)
        assert keyed.post("/v1/translate", json={"text": "Save"}).status_code == 401


def test_page_and_its_assets_are_served_without_external_references(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in ("static/app.js", "static/style.css"):
        assert f'"{asset}"' in page.text
        response = client.get(f"/{asset}")
        assert response.status_code == 200
        assert "http://" not in response.text and "https://" not in response.text
    assert "http://" not in page.text and "https://" not in page.text


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_api_docs_load_their_scripts_from_this_server(client, path):
    page = client.get(path).text
    assert "cdn" not in page.lower()
    scripts = [part.split('"')[0] for part in page.split('src="')[1:]]
    assert scripts, page
    for script in scripts:
        assert script.startswith("/static-docs/"), script
        assert client.get(script).status_code == 200


# --- /translate: format html, alternatives ------------------------------------------------------


def test_libretranslate_html_translates_text_nodes_and_keeps_markup(client):
    html = '<p class="x">Save <b>changes</b> now.</p><pre>Open file</pre><p translate="no">Help</p>'
    response = client.post("/translate", json={"q": html, "source": "en", "format": "html"})
    assert response.status_code == 200, response.text
    [unit] = served(client, ["Save <b>changes</b> now."])
    assert response.json() == {
        "translatedText": f'<p class="x">{unit}</p><pre>Open file</pre><p translate="no">Help</p>'
    }


def test_libretranslate_html_fragment_with_more_units_than_texts_per_request(client):
    items = ["Save", "Open", "Close", "Delete the file", "Search", "Print"]  # > 4 texts
    html = "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"
    response = client.post("/translate", json={"q": [html, "<i>Help</i>"], "format": "html"})
    assert response.status_code == 200, response.text
    first, second = response.json()["translatedText"]
    assert first == "<ul>" + "".join(f"<li>{t}</li>" for t in served(client, items)) + "</ul>"
    assert second == served(client, ["<i>Help</i>"])[0]


def test_alternatives_come_from_the_beam_and_differ_from_the_translation(client):
    texts = ["Save changes", "Open the window and close all files", "Delete the folder"]
    response = client.post("/translate", json={"q": texts, "source": "en", "alternatives": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    # The translation is the best of a beam of alternatives + 1 = 3.
    best = client.post("/v1/translate", json={"text": texts, "beam_size": 3}).json()
    assert body["translatedText"] == [t["text"] for t in best["translations"]]
    assert len(body["alternatives"]) == len(texts)
    for translation, others in zip(body["translatedText"], body["alternatives"], strict=True):
        assert len(others) <= 2 and len(set(others)) == len(others)
        assert translation not in others
    assert any(body["alternatives"]), "a beam of 3 found no second hypothesis for any text"


def test_alternatives_of_one_text_is_a_flat_list_and_html_gets_none(client):
    one = client.post("/translate", data={"q": "Save changes", "alternatives": "1"}).json()
    assert isinstance(one["alternatives"], list) and len(one["alternatives"]) <= 1
    assert all(isinstance(alternative, str) for alternative in one["alternatives"])
    html = client.post("/translate", json={"q": "<b>Save</b>", "format": "html", "alternatives": 1})
    assert html.json()["alternatives"] == []
    assert "alternatives" not in client.post("/translate", json={"q": "Save"}).json()


@pytest.mark.parametrize(
    ("alternatives", "error"),
    [
        ("many", "Invalid request: alternatives parameter is not a number"),
        (3, "Invalid request: alternatives parameter must be <= 2"),
    ],
)
def test_alternatives_refusals_use_libretranslate_texts(client, alternatives, error):
    response = client.post("/translate", json={"q": "Save", "alternatives": alternatives})
    assert response.status_code == 400 and response.json()["error"] == error


# --- the real LibreTranslate client ---------------------------------------------------------------


def test_libretranslatepy_translates_and_lists_languages(model_dir, tmp_path):
    from libretranslatepy import LibreTranslateAPI

    from tests.live_server import live_server

    with live_server(make_settings(model_dir, tmp_path)) as base:
        api = LibreTranslateAPI(base)
        expected = httpx.post(f"{base}v1/translate", json={"text": "Save changes"}).json()
        assert api.translate("Save changes", "en", "de") == expected["translations"][0]["text"]
        assert sorted(api.languages(), key=lambda language: language["code"]) == [
            {"code": "de", "name": "German", "targets": []},
            {"code": "en", "name": "English", "targets": ["de"]},
        ]


def test_weblate_batch_request_gets_one_translation_per_text(client):
    """Weblate's LibreTranslate machinery: JSON, ``q`` a list, ``api_key`` possibly empty;
    it reads ``translatedText`` by index and the codes of ``/languages``."""
    texts = ["Save changes", "Open the file", "Close"]
    body = {"api_key": "", "q": texts, "source": "en", "target": "de"}
    response = client.post("/translate", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == served(client, texts)
    assert {"en", "de"} <= {language["code"] for language in client.get("/languages").json()}


def test_download_refuses_alike_when_file_translation_is_off(model_dir, tmp_path):
    settings = make_settings(model_dir, tmp_path, files_translation=False)
    with TestClient(create_app(settings)) as off:
        response = off.get("/download_file/00000000-0000-0000-0000-000000000000.a.txt")
        assert response.status_code == 403
        assert response.json()["code"] == "files_disabled"
