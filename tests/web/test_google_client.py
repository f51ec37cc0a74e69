"""Google's Cloud Translation API v2: the official ``google-cloud-translate`` client
(``translate_v2``), unchanged, pointed at the real app on a real socket with tiny models
(en→de, de→en, en→fr), and Google's request and error shapes over plain HTTP.

The tiny models translate into noise, so each expected translation is the service's own
through its native API (``/v1/translate``) or LibreTranslate's ``format: "html"``.
"""

from __future__ import annotations

import httpx
import pytest

from service.config import Settings
from tests.live_server import live_server
from tests.service_fixtures import language_models

translate_v2 = pytest.importorskip("google.cloud.translate_v2")
api_exceptions = pytest.importorskip("google.api_core.exceptions")
from google.auth.credentials import AnonymousCredentials  # noqa: E402

KEY = "google-key-4711"
ENGLISH = "Save the file before you close the window."
GERMAN = "Bitte speichern Sie die Datei, bevor Sie das Fenster schließen."
API = "language/translate/v2"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return language_models(tmp_path_factory)


def serve(models, tmp_path_factory, **overrides):
    settings = Settings(
        exports=list(models.values()),
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=16,
        data_dir=tmp_path_factory.mktemp("google_data"),
        **overrides,
    )
    return live_server(settings)


@pytest.fixture(scope="module")
def base_url(models, tmp_path_factory):
    with serve(models, tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module")
def keyed_url(models, tmp_path_factory):
    with serve(models, tmp_path_factory, api_keys=KEY, rate_limit_requests_per_minute=2) as url:
        yield url


def google_client(base_url: str, http=None):
    """The official client as its documentation shows it, at this service's address."""
    return translate_v2.Client(
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": base_url.rstrip("/")},
        _http=http,
    )


def v1(base_url: str, text: str, source: str, target: str) -> str:
    body = {"text": text, "source_lang": source, "target_lang": target}
    response = httpx.post(f"{base_url}v1/translate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]["text"]


def html(base_url: str, text: str, source: str, target: str) -> str:
    body = {"q": text, "source": source, "target": target, "format": "html"}
    response = httpx.post(f"{base_url}translate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["translatedText"]


# --- the official client ----------------------------------------------------------------------


def test_the_official_client_translates_text_as_the_native_api_does(base_url):
    client = google_client(base_url)
    result = client.translate(ENGLISH, target_language="de", source_language="en", format_="text")
    assert result["translatedText"] == v1(base_url, ENGLISH, "en", "de")
    assert result["input"] == ENGLISH
    assert "detectedSourceLanguage" not in result  # the source was given


def test_html_is_googles_default_format(base_url):
    client = google_client(base_url)
    fragment = "<p>Save the <b>file</b> now.</p>"
    result = client.translate(fragment, target_language="de", source_language="en")
    assert result["translatedText"] == html(base_url, fragment, "en", "de")


def test_each_text_is_detected_on_its_own_and_the_model_is_echoed(base_url):
    client = google_client(base_url)
    results = client.translate([ENGLISH, GERMAN], target_language="en", format_="text", model="nmt")
    assert [r["detectedSourceLanguage"] for r in results] == ["en", "de"]
    assert results[0]["translatedText"] == ENGLISH  # en→en: nothing to translate
    assert results[1]["translatedText"] == v1(base_url, GERMAN, "de", "en")
    assert {r["model"] for r in results} == {"nmt"}


def test_the_official_client_detects_each_text(base_url):
    client = google_client(base_url)
    english, german = client.detect_language([ENGLISH, GERMAN])
    assert (english["language"], german["language"]) == ("en", "de")
    assert 0 < english["confidence"] <= 1 and english["input"] == ENGLISH


def test_the_official_client_lists_the_served_languages_with_names(base_url):
    languages = google_client(base_url).get_languages()
    assert {"language": "fr", "name": "French"} in languages
    assert sorted(entry["language"] for entry in languages) == ["de", "en", "fr"]


def test_an_unserved_language_raises_the_clients_bad_request_with_the_message(base_url):
    with pytest.raises(api_exceptions.BadRequest) as raised:
        google_client(base_url).translate(ENGLISH, target_language="ja", source_language="en")
    assert "ja" in raised.value.message


def test_keys_come_as_the_key_parameter_and_limits_hold(keyed_url):
    import requests

    with pytest.raises(api_exceptions.Forbidden) as missing:
        google_client(keyed_url).translate(ENGLISH, target_language="de")
    assert "missing a valid API key" in missing.value.message
    session = requests.Session()
    session.params = {"key": KEY}  # type: ignore[assignment]  # as Google's key=... parameter
    client = google_client(keyed_url, session)
    assert client.translate(ENGLISH, target_language="de", source_language="en")["translatedText"]
    assert client.detect_language(GERMAN)["language"] == "de"
    # The same limit as every API: two requests a minute for this key.
    response = httpx.post(
        f"{keyed_url}{API}", json={"q": "Save", "target": "de"}, headers={"X-Goog-Api-Key": KEY}
    )
    assert response.status_code == 429
    assert response.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    with pytest.raises(api_exceptions.TooManyRequests):
        client.translate(ENGLISH, target_language="de")


# --- plain HTTP: the GET forms and the error shape ---------------------------------------------


def test_the_get_form_takes_repeated_q_in_the_query(base_url):
    query = [("q", "Save"), ("q", "Open the file."), ("target", "de"), ("source", "en")]
    response = httpx.get(f"{base_url}{API}", params=query + [("format", "text")])
    assert response.status_code == 200, response.text
    translations = response.json()["data"]["translations"]
    assert [t["translatedText"] for t in translations] == [
        v1(base_url, "Save", "en", "de"),
        v1(base_url, "Open the file.", "en", "de"),
    ]
    detected = httpx.get(f"{base_url}{API}/detect", params={"q": GERMAN}).json()
    assert detected["data"]["detections"][0][0]["language"] == "de"
    unnamed = httpx.get(f"{base_url}{API}/languages").json()["data"]["languages"]
    assert unnamed and all(set(entry) == {"language"} for entry in unnamed)


def test_a_form_body_is_read_as_google_reads_it(base_url):
    form = {"q": ["Save", "Open"], "target": "de", "source": "en", "format": "text"}
    response = httpx.post(f"{base_url}{API}", data=form)
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]["translations"]) == 2


def google_error(response: httpx.Response, status: int, name: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (status, name)
    [detail] = error["errors"]
    assert detail["message"] == error["message"] and detail["domain"] == "global"
    return error["message"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"target": "de"}, "q"),
        ({"q": "Save"}, "target"),
        ({"q": ["Save", 7], "target": "de"}, "q"),
        ({"q": "Save", "target": "de", "format": "pdf"}, "format"),
        ({"q": "Save", "target": "xx"}, "xx"),
    ],
)
def test_bad_requests_get_googles_error_shape_with_a_message(base_url, body, words):
    message = google_error(httpx.post(f"{base_url}{API}", json=body), 400, "INVALID_ARGUMENT")
    assert words in message


def test_malformed_json_and_a_bad_key_get_googles_error_shape(base_url, keyed_url):
    malformed = httpx.post(
        f"{base_url}{API}", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert "JSON" in google_error(malformed, 400, "INVALID_ARGUMENT")
    body = {"q": "Save", "target": "de"}
    google_error(httpx.post(f"{keyed_url}{API}", json=body), 403, "PERMISSION_DENIED")
    wrong = httpx.post(f"{keyed_url}{API}", json=body, params={"key": "nope"})
    google_error(wrong, 403, "PERMISSION_DENIED")
    bearer = httpx.post(
        f"{keyed_url}{API}/detect", json=body, headers={"Authorization": "Bearer x"}
    )
    google_error(bearer, 403, "PERMISSION_DENIED")  # refused at the gate, before the body


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_the_in_flight_bound_answers_in_googles_shape_for_both_methods(method):
    import asyncio
    import json

    from service.metrics import ServiceMetrics
    from service.web.inflight import InflightGate

    async def unreachable(scope, receive, send):  # the gate refuses before the app
        raise AssertionError("admitted")

    gate = InflightGate(unreachable, max_in_flight=0, retry_after_s=3, metrics=ServiceMetrics())
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/language/translate/v2", "headers": []}
    asyncio.run(gate(scope, None, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 429 and (b"retry-after", b"3") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert (
        error["status"] == "RESOURCE_EXHAUSTED" and "MT_MAX_INFLIGHT_REQUESTS" in error["message"]
    )
