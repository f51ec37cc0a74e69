"""The two translation routes run directly (service/web/direct.py) answer what FastAPI's
own handling of them answers: the same status, headers and body bytes, for translations and
for every error, whether the direct path answers or hands the request on."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.config import Settings
from service.web.direct import DirectRoutes
from service.wiring import create_app
from tests.ready import wait_ready
from tests.service_fixtures import tiny_model

API_KEY = "direct-key-4711"
LIMITS = dict(max_texts_per_request=4, max_chars_per_text=200, max_beam_size=4, max_new_tokens=24)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def without_direct_routes(app: FastAPI) -> FastAPI:
    """The app as it was before the direct layer: FastAPI runs every route (the middleware
    stack is built at the first request, so this holds from the start)."""
    app.user_middleware = [m for m in app.user_middleware if m.cls is not DirectRoutes]
    return app


def clients(model_dir, tmp_path, **overrides):
    settings = Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        data_dir=tmp_path / "data",
        **{**LIMITS, **overrides},
    )
    direct = create_app(settings)
    assert any(m.cls is DirectRoutes for m in direct.user_middleware)
    return TestClient(direct), TestClient(without_direct_routes(create_app(settings)))


@pytest.fixture(scope="module")
def pair(model_dir, tmp_path_factory):
    direct, framework = clients(model_dir, tmp_path_factory.mktemp("direct"))
    with direct, framework:
        wait_ready(direct)
        wait_ready(framework)
        yield direct, framework


@pytest.fixture(scope="module")
def keyed_pair(model_dir, tmp_path_factory):
    direct, framework = clients(model_dir, tmp_path_factory.mktemp("keyed"), api_keys=API_KEY)
    with direct, framework:
        wait_ready(direct)
        wait_ready(framework)
        yield direct, framework


TIME_MS = re.compile(rb'"time_ms":[0-9.e+-]+')


def answer(client: TestClient, path: str, **kwargs) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers in order and the body; the request id's value, ``time_ms`` (a
    duration) and so the body's length aside."""
    response = client.post(path, **kwargs)
    assert int(response.headers["content-length"]) == len(response.content)
    aside = {"x-request-id": "<id>", "content-length": "<length>"}
    headers = [(name, aside.get(name, value)) for name, value in response.headers.multi_items()]
    assert "x-request-id" in dict(headers)
    return response.status_code, headers, TIME_MS.sub(b'"time_ms":0', response.content)


def assert_same(pair, path: str, **kwargs) -> int:
    direct, framework = pair
    got, expected = answer(direct, path, **kwargs), answer(framework, path, **kwargs)
    assert got == expected
    return got[0]


V1_CASES = {
    "one text": dict(json={"text": "Save changes"}),
    "a list": dict(json={"text": ["Open the file", "Print", ""], "beam_size": 2}),
    "detected source": dict(json={"text": "Open the file", "source_lang": "auto"}),
    "charset in the content type": dict(
        content=b'{"text": "Print"}', headers={"Content-Type": "application/json; charset=utf-8"}
    ),
    "unknown field": dict(json={"text": "Print", "colour": "red"}),
    "number in the list": dict(json={"text": ["Print", 3]}),
    "beam over the limit": dict(json={"text": "Print", "beam_size": 9}),
    "unknown language": dict(json={"text": "Print", "source_lang": "xx"}),
    "too many texts": dict(json={"text": ["a"] * 5}),
    "malformed JSON": dict(content=b'{"text": ', headers={"Content-Type": "application/json"}),
    "not an object": dict(json=["Print"]),
    "nested too deeply": dict(
        content=b'{"text": ' + b"[" * 20000 + b"]" * 20000 + b"}",
        headers={"Content-Type": "application/json"},
    ),
    "empty body": dict(content=b"", headers={"Content-Type": "application/json"}),
    "no content type": dict(content=b'{"text": "Print"}'),
    "text content type": dict(content=b'{"text": "Print"}', headers={"Content-Type": "text/plain"}),
    "unpaired surrogate": dict(
        content=b'{"text": "a\\ud800"}', headers={"Content-Type": "application/json"}
    ),
}


@pytest.mark.parametrize("case", V1_CASES)
def test_v1_translate_answers_as_fastapi_does(pair, case):
    assert_same(pair, "/v1/translate", **V1_CASES[case])


LIBRE_CASES = {
    "one text": dict(json={"q": "Save changes", "source": "en", "target": "de"}),
    "a list": dict(json={"q": ["Open the file", "Print"], "source": "en", "target": "de"}),
    "detected source": dict(json={"q": "Open the file", "source": "auto", "target": "de"}),
    "alternatives": dict(json={"q": "Print", "source": "en", "target": "de", "alternatives": 2}),
    "html": dict(json={"q": "<b>Print</b> it", "source": "en", "target": "de", "format": "html"}),
    "form fields": dict(data={"q": "Print", "source": "en", "target": "de"}),
    "missing q": dict(json={"source": "en", "target": "de"}),
    "alternatives not a number": dict(json={"q": "Print", "alternatives": "many"}),
    "alternatives over the limit": dict(json={"q": "Print", "alternatives": 40}),
    "bad format": dict(json={"q": "Print", "format": "pdf"}),
    "malformed JSON": dict(content=b'{"q": ', headers={"Content-Type": "application/json"}),
    "nested too deeply": dict(
        content=b'{"q": ' + b"[" * 20000 + b"]" * 20000 + b"}",
        headers={"Content-Type": "application/json"},
    ),
    "no content type": dict(content=b'{"q": "Print", "source": "en", "target": "de"}'),
    "unknown language": dict(json={"q": "Print", "source": "en", "target": "xx"}),
    "too long": dict(json={"q": "word " * 60, "source": "en", "target": "de"}),
}


@pytest.mark.parametrize("case", LIBRE_CASES)
def test_libretranslate_translate_answers_as_fastapi_does(pair, case):
    assert_same(pair, "/translate", **LIBRE_CASES[case])


@pytest.mark.parametrize(
    "path, kwargs",
    [
        ("/translate", dict(json={"q": "Print", "api_key": API_KEY})),
        ("/translate", dict(json={"q": "Print", "api_key": "wrong"})),
        ("/translate", dict(json={"q": "Print"})),
        ("/v1/translate", dict(json={"text": "Print"}, headers={"Authorization": "Bearer x"})),
        ("/v1/translate", dict(json={"text": "Print"})),
        (
            "/v1/translate",
            dict(json={"text": "Print"}, headers={"Authorization": f"Bearer {API_KEY}"}),
        ),
    ],
)
def test_keys_are_checked_as_fastapi_does(keyed_pair, path, kwargs):
    assert_same(keyed_pair, path, **kwargs)


def test_direct_answers_are_counted_under_their_route(pair):
    direct, _ = pair

    def count(route: str, status: str) -> float:
        pattern = rf'^mt_requests_total\{{route="{re.escape(route)}",status="{status}"\}} (\S+)$'
        found = re.search(pattern, direct.get("/metrics").text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    before = count("/v1/translate", "200"), count("/translate", "400")
    assert direct.post("/v1/translate", json={"text": "Print"}).status_code == 200
    assert direct.post("/translate", json={"source": "en"}).status_code == 400
    assert (count("/v1/translate", "200"), count("/translate", "400")) == (
        before[0] + 1,
        before[1] + 1,
    )


def test_a_client_request_id_comes_back_on_a_direct_answer(pair):
    direct, _ = pair
    response = direct.post(
        "/v1/translate", json={"text": "Print"}, headers={"X-Request-ID": "client-id-1"}
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "client-id-1"


def direct_layer(app: FastAPI) -> DirectRoutes:
    layer = app.middleware_stack
    while not isinstance(layer, DirectRoutes):
        layer = layer.app  # type: ignore[union-attr]
    return layer


def test_plain_translation_requests_never_reach_the_router(pair):
    direct, _ = pair
    layer = direct_layer(direct.app)  # type: ignore[arg-type]
    reached: list[str] = []
    router = layer.app

    async def recording(scope, receive, send):
        reached.append(scope["path"])
        await router(scope, receive, send)

    layer.app = recording
    try:
        ok = direct.post("/v1/translate", json={"text": "Print"})
        libre = direct.post("/translate", json={"q": "Print", "source": "en", "target": "de"})
        refused = direct.post("/translate", json={"source": "en"})
        assert reached == []
        invalid = direct.post("/v1/translate", json={"text": 3})
        form = direct.post("/translate", data={"q": "Print", "source": "en", "target": "de"})
        assert reached == ["/v1/translate", "/translate"]
    finally:
        layer.app = router
    assert (ok.status_code, libre.status_code, refused.status_code) == (200, 200, 400)
    assert (invalid.status_code, form.status_code) == (422, 200)


def test_fastapis_telemetry_asks_nothing_per_request_unless_opentelemetry_is_set_up():
    from service.web.app import TELEMETRY_OFF, telemetry_config

    assert telemetry_config({"PATH": "/usr/bin", "MT_PORT": "8000"}) == TELEMETRY_OFF
    assert telemetry_config({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) is None
    assert telemetry_config({"FASTAPI_OTEL_AUTO_CONFIGURE": "true"}) is None
    app = FastAPI(telemetry=telemetry_config({}))
    assert app._native_telemetry.enabled() is False
