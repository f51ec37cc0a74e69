"""LibreTranslate's own API test suite, run against this service.

Each test below re-expresses one test of LibreTranslate's ``libretranslate/tests/test_api/``
(https://github.com/LibreTranslate/LibreTranslate, AGPL-3.0; read at commit 39429cb): the
same requests, the same assertions, in the same order; the file and test it comes from are
named above each. Two things differ, both forced by the setting:

* LibreTranslate's fixture loads ``--load-only en,es``; this service serves en→de and de→en
  here (the tiny models of tests/service_fixtures.py), so the target ``es`` is ``de``.
* LibreTranslate's tests call Flask's test client (``client.post(url, data=...)``,
  ``response.data``, the ``response.json`` property). :class:`FlaskStyleClient` offers that
  interface over FastAPI's TestClient, so each test body reads as the original does.

One app serves the whole module (LibreTranslate builds one per test): none of the tests
changes the app's state, and loading the models per test would only add minutes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.wiring import create_app
from tests.service_fixtures import language_models

TARGET = "de"  # LibreTranslate's suite translates en→es; this service serves en→de


class FlaskStyleResponse:
    """The parts of Flask's test response the suite reads: ``status_code``, ``data`` (the
    body's bytes) and ``json`` (a property: the parsed body, None when it is not JSON)."""

    def __init__(self, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.data = response.content
        self.headers = response.headers

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.data)
        except ValueError:
            return None


class FlaskStyleClient:
    """Flask's ``app.test_client()`` interface over FastAPI's TestClient: ``data=`` a dict is
    sent as form fields, ``json=`` as a JSON body, as Flask's client sends them."""

    def __init__(self, client: TestClient) -> None:
        self._client = client

    def get(self, url: str, **kwargs: Any) -> FlaskStyleResponse:
        return FlaskStyleResponse(self._client.get(url, **kwargs))

    def post(
        self, url: str, data: dict[str, Any] | None = None, json: Any = None
    ) -> FlaskStyleResponse:
        if json is not None:
            return FlaskStyleResponse(self._client.post(url, json=json))
        return FlaskStyleResponse(self._client.post(url, data=data))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    models = language_models(tmp_path_factory)
    settings = Settings(
        exports=[models[("en", "de")], models[("de", "en")]],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=16,
    )
    with TestClient(create_app(settings)) as test_client:
        for _ in range(600):
            if test_client.get("/ready").status_code == 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"never ready: {test_client.get('/ready').json()}")
        yield FlaskStyleClient(test_client)


def test_the_shim_sends_what_flasks_test_client_sends(client):
    """``data=`` is form-encoded and ``json=`` is JSON, as with Flask's client: our routes
    read both, so the suite below exercises both readers."""
    seen = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("content-type", ""), request.content))
        return httpx.Response(200, json={"ok": True})

    with httpx.Client(transport=httpx.MockTransport(record), base_url="http://t") as raw:
        shim = FlaskStyleClient(raw)  # type: ignore[arg-type]
        assert shim.post("/x", data={"q": "Hello"}).json == {"ok": True}
        shim.post("/x", json={"q": ["a"]})
    assert seen[0] == ("application/x-www-form-urlencoded", b"q=Hello")
    assert seen[1][0] == "application/json" and json.loads(seen[1][1]) == {"q": ["a"]}


# --- test_api_detect_language.py -------------------------------------------------------------


def test_api_detect_language(client):
    response = client.post("/detect", data={"q": "Hello"})
    response_json = json.loads(response.data)

    assert "confidence" in response_json[0] and "language" in response_json[0]
    assert len(response_json) >= 1
    assert response.status_code == 200


def test_api_detect_language_must_fail_without_parameters(client):
    response = client.post("/detect")
    response_json = json.loads(response.data)

    assert "error" in response_json
    assert response.status_code == 400


def test_api_detect_language_must_fail_bad_request_type(client):
    response = client.get("/detect")

    assert response.status_code == 405


# --- test_api_frontend_settings.py -----------------------------------------------------------


def test_api_get_frontend_settings(client):
    response = client.get("/frontend/settings")

    assert response.status_code == 200


# --- test_api_get_languages.py ---------------------------------------------------------------


def test_api_get_languages(client):
    response = client.get("/languages")
    response_json = json.loads(response.data)

    assert "code" in response_json[0] and "name" in response_json[0]
    assert len(response_json) >= 1
    assert response.status_code == 200


def test_api_get_languages_must_fail_bad_request_type(client):
    response = client.post("/languages")

    assert response.status_code == 405


# --- test_api_health.py ----------------------------------------------------------------------


def test_api_get_health(client):
    response = client.get("/health")

    assert response.status_code == 200
    assert response.json == {"status": "ok"}


def test_api_health_must_fail_bad_request_type(client):
    response = client.post("/health")

    assert response.status_code == 405


# --- test_api_spec.py ------------------------------------------------------------------------


def test_api_get_spec(client):
    response = client.get("/spec")

    assert response.status_code == 200


def test_api_get_spec_must_fail_bad_request_type(client):
    response = client.post("/spec")

    assert response.status_code == 405


def test_spec_is_the_services_api_document(client):
    """Beyond LibreTranslate's status check: ``/spec`` is the OpenAPI document that
    ``/openapi.json`` serves, and it describes LibreTranslate's routes."""
    spec = client.get("/spec").json
    assert spec == client.get("/openapi.json").json
    assert {"/translate", "/detect", "/languages"} <= set(spec["paths"])


# --- test_api_translate.py -------------------------------------------------------------------


def test_api_translate(client):
    response = client.post(
        "/translate", data={"q": "Hello", "source": "en", "target": TARGET, "format": "text"}
    )

    response_json = json.loads(response.data)

    assert "translatedText" in response_json
    assert response.status_code == 200


def test_api_translate_batch(client):
    response = client.post(
        "/translate",
        json={"q": ["Hello", "World"], "source": "en", "target": TARGET, "format": "text"},
    )

    response_json = json.loads(response.data)

    assert "translatedText" in response_json
    assert isinstance(response_json["translatedText"], list)
    assert len(response_json["translatedText"]) == 2
    assert response.status_code == 200


def test_api_translate_unsupported_language(client):
    response = client.post(
        "/translate", data={"q": "Hello", "source": "en", "target": "zz", "format": "text"}
    )

    response_json = json.loads(response.data)

    assert "error" in response_json
    assert response_json["error"] == "zz is not supported"
    assert response.status_code == 400


def test_api_translate_missing_parameter(client):
    response = client.post("/translate", data={"source": "en", "target": TARGET, "format": "text"})

    response_json = json.loads(response.data)

    assert "error" in response_json
    assert response_json["error"] == "Invalid request: missing q parameter"
    assert response.status_code == 400
