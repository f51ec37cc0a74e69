"""Access control and limits against the real app (tiny real model): API keys, per-key and
per-client rate limits on a fake clock, the /metrics token, CORS, request ids, and no
internals in error bodies. Everything here is off by default; each test turns on one thing.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.web.access import AccessPolicy
from service.web.request_id import RequestIdLogFilter
from service.wiring import create_app
from tests.ready import wait_ready
from tests.service_fixtures import tiny_model


class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def started(model_dir, clock: FakeClock | None = None, **overrides) -> TestClient:
    settings = Settings(
        exports=[model_dir], provider="cpu", intra_op_threads=1, max_new_tokens=8, **overrides
    )
    app = create_app(settings)
    if clock is not None:
        app.state.access = AccessPolicy(settings, clock=clock)
    client = TestClient(app)
    client.__enter__()
    wait_ready(client)
    return client


@pytest.fixture
def make_client(model_dir):
    clients: list[TestClient] = []

    def make(clock: FakeClock | None = None, **overrides) -> TestClient:
        clients.append(started(model_dir, clock, **overrides))
        return clients[-1]

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- defaults ---------------------------------------------------------------------------------


def test_everything_is_open_by_default(make_client):
    client = make_client()
    for _ in range(5):
        assert client.post("/v1/translate", json={"text": "Save"}).status_code == 200
    assert client.get("/metrics").status_code == 200
    response = client.options(
        "/translate",
        headers={"Origin": "https://example.org", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in response.headers


# --- API keys ---------------------------------------------------------------------------------


def test_a_valid_key_is_accepted_as_bearer_and_as_libretranslate_field(make_client):
    client = make_client(api_keys="alpha, beta")
    assert client.post("/v1/translate", json={"text": "Save"}, headers=bearer("alpha")).is_success
    assert client.post("/translate", json={"q": "Save", "api_key": "beta"}).is_success
    assert client.post("/translate", data={"q": "Save", "api_key": "alpha"}).is_success
    assert client.post("/translate", json={"q": "Save"}, headers=bearer("beta")).is_success


def test_an_unknown_key_is_403_with_libretranslates_text(make_client):
    client = make_client(api_keys="alpha")
    for response in (
        client.post("/v1/translate", json={"text": "Save"}, headers=bearer("wrong")),
        client.post("/translate", json={"q": "Save", "api_key": "wrong"}),
    ):
        assert response.status_code == 403
        assert response.json() == {"error": "Invalid API key", "code": "invalid_api_key"}


def test_a_missing_key_is_401_when_keys_are_on(make_client):
    client = make_client(api_keys="alpha")
    for response in (
        client.post("/v1/translate", json={"text": "Save"}),
        client.post("/translate", json={"q": "Save"}),
        client.post("/v1/translate", json={"text": "Save"}, headers={"Authorization": "Basic x"}),
    ):
        assert response.status_code == 401
        assert response.json()["error"] == "Please contact the server operator to get an API key"
        assert response.headers["WWW-Authenticate"] == "Bearer"


def test_keys_and_their_limits_come_from_a_file(make_client, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(
        json.dumps({"gold": {"requests_per_minute": 100}, "tin": {"requests_per_minute": 1}})
    )
    client = make_client(clock=FakeClock(), api_keys_file=str(keys))
    assert client.post("/v1/translate", json={"text": "a"}, headers=bearer("tin")).is_success
    assert (
        client.post("/v1/translate", json={"text": "a"}, headers=bearer("tin")).status_code == 429
    )
    for _ in range(3):
        assert client.post("/v1/translate", json={"text": "a"}, headers=bearer("gold")).is_success


# --- rate limits ------------------------------------------------------------------------------


def test_requests_per_minute_answer_429_with_retry_after_and_recover_on_the_clock(make_client):
    clock = FakeClock()
    client = make_client(clock=clock, rate_limit_requests_per_minute=3)
    for _ in range(3):
        assert client.post("/v1/translate", json={"text": "Save"}).status_code == 200
        clock.advance(10)
    refused = client.post("/v1/translate", json={"text": "Save"})
    assert refused.status_code == 429
    assert refused.json() == {"error": "Slowdown: 3 requests per 1 minute", "code": "rate_limited"}
    # The oldest of the three was 30 s ago: room again in 30 s (moving window).
    assert refused.headers["Retry-After"] == "30"
    clock.advance(29)
    assert client.post("/translate", json={"q": "Save"}).status_code == 429
    clock.advance(1.5)
    assert client.post("/translate", json={"q": "Save"}).status_code == 200


def test_characters_per_minute_count_every_text_of_a_request(make_client):
    clock = FakeClock()
    client = make_client(clock=clock, rate_limit_chars_per_minute=20)
    assert client.post("/v1/translate", json={"text": ["Save", "Open file"]}).is_success  # 13
    refused = client.post("/v1/translate", json={"text": "Close window"})  # 12 > 7 left
    assert refused.status_code == 429
    assert "20 characters per 1 minute" in refused.json()["error"]
    assert refused.headers["Retry-After"] == "60"
    assert client.post("/v1/translate", json={"text": "Close"}).is_success  # 5 fit
    too_big = client.post("/v1/translate", json={"text": "x" * 21})
    assert too_big.status_code == 413 and "limit is 20 characters" in too_big.json()["error"]


def test_a_files_texts_count_against_the_characters_per_minute(make_client, tmp_path):
    clock = FakeClock()
    client = make_client(clock=clock, rate_limit_chars_per_minute=20, files_dir=tmp_path)

    def translate_file(text: str):
        return client.post(
            "/translate_file",
            data={"source": "en", "target": "de"},
            files={"file": ("notes.txt", text.encode())},
        )

    assert translate_file("Save\n\nOpen file\n").status_code == 200  # 4 + 9 characters
    refused = client.post("/translate", json={"q": "Close window"})  # 12 > 7 left
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
    refused = translate_file("Close it")  # 8 > 7 left
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
    assert "20 characters per 1 minute" in refused.json()["error"]
    too_big = translate_file("x" * 21)
    assert too_big.status_code == 413 and "limit is 20 characters" in too_big.json()["error"]
    clock.advance(61)
    assert translate_file("Close window").status_code == 200


def test_limits_are_per_key(make_client):
    client = make_client(clock=FakeClock(), api_keys="a,b", rate_limit_requests_per_minute=1)
    assert client.post("/v1/translate", json={"text": "x"}, headers=bearer("a")).is_success
    assert client.post("/v1/translate", json={"text": "x"}, headers=bearer("a")).status_code == 429
    assert client.post("/v1/translate", json={"text": "x"}, headers=bearer("b")).is_success


def test_without_keys_limits_are_per_client_address(model_dir):
    clock = FakeClock()
    settings = Settings(exports=[model_dir], rate_limit_requests_per_minute=1)
    policy = AccessPolicy(settings, clock=clock)

    class Request:
        def __init__(self, host: str) -> None:
            self.headers: dict[str, str] = {}
            self.client = type("Client", (), {"host": host})()

    policy.admit(Request("10.0.0.1"), None, chars=1)
    policy.admit(Request("10.0.0.2"), None, chars=1)
    with pytest.raises(Exception) as refused:
        policy.admit(Request("10.0.0.1"), None, chars=1)
    assert refused.value.status == 429


def test_a_refused_request_is_not_counted(make_client):
    clock = FakeClock()
    client = make_client(
        clock=clock, rate_limit_requests_per_minute=10, rate_limit_chars_per_minute=10
    )
    assert client.post("/v1/translate", json={"text": "x" * 11}).status_code == 413
    for _ in range(10):
        assert client.post("/v1/translate", json={"text": "x"}).status_code == 200


# --- /metrics token, CORS, request ids ---------------------------------------------------------


def test_metrics_need_the_token_when_one_is_set(make_client):
    client = make_client(metrics_token="s3cret")
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer("nope")).json()["error"] == "Unauthorized"
    response = client.get("/metrics", headers=bearer("s3cret"))
    assert response.status_code == 200 and "mt_requests_total" in response.text
    assert client.get("/health").status_code == 200  # probes need no token


def test_cors_allows_the_configured_origins_only(make_client):
    client = make_client(cors_origins="https://app.example.org")
    preflight = client.options(
        "/v1/translate",
        headers={"Origin": "https://app.example.org", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example.org"
    response = client.post(
        "/v1/translate", json={"text": "Save"}, headers={"Origin": "https://app.example.org"}
    )
    assert response.headers["access-control-allow-origin"] == "https://app.example.org"
    assert "X-Request-ID" in response.headers["access-control-expose-headers"]
    other = client.post(
        "/v1/translate", json={"text": "Save"}, headers={"Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers


def test_every_response_has_a_request_id_and_a_good_one_is_kept(make_client):
    client = make_client(api_keys="k")
    responses = [
        client.get("/health"),
        client.post("/v1/translate", json={"text": "Save"}, headers=bearer("k")),
        client.post("/v1/translate", json={"text": "Save"}),  # 401
        client.post("/v1/translate", content=b"{", headers={"content-type": "application/json"}),
        client.get("/no/such/route"),
    ]
    ids = [response.headers["X-Request-ID"] for response in responses]
    assert all(len(request_id) == 32 for request_id in ids) and len(set(ids)) == len(ids)
    kept = client.get("/health", headers={"X-Request-ID": "gateway-7f3a.1"})
    assert kept.headers["X-Request-ID"] == "gateway-7f3a.1"
    replaced = client.get("/health", headers={"X-Request-ID": "bad id\twith tab"})
    assert replaced.headers["X-Request-ID"] != "bad id\twith tab"


def test_the_request_id_is_in_the_log_lines_of_its_request(make_client, caplog):
    client = make_client()
    log_filter = RequestIdLogFilter()
    caplog.handler.addFilter(log_filter)
    with caplog.at_level(logging.INFO):
        response = client.post("/v1/translate", json={"text": ["a"] * 1000})  # 413, logged
    request_id = response.headers["X-Request-ID"]
    assert response.status_code == 413
    assert any(getattr(record, "request_id", None) == request_id for record in caplog.records)


STORED_ITEM_ROUTES = ("/v1/glossaries", "/v1/memories", "/v1/documents", "/v2/glossar", "/v2/doc")


def dependency_calls(dependant) -> set:
    """Every function a route's dependency tree calls."""
    calls = set()
    pending = list(dependant.dependencies)
    while pending:
        dependency = pending.pop()
        calls.add(dependency.call)
        pending.extend(dependency.dependencies)
    return calls


def test_every_stored_item_route_is_admitted_through_the_owner_dependency():
    """Glossaries, memories and document jobs, on both APIs: keys, limits and the owner come
    from one dependency, so no route of them can forget the access check."""
    from fastapi.routing import APIRoute

    from service.web.app import ROUTERS
    from service.web.deps import get_current_owner
    from service.web.routes.deepl import get_deepl_owner

    routes = [
        route
        for module, _tag in ROUTERS
        for route in module.router.routes
        if isinstance(route, APIRoute) and route.path.startswith(STORED_ITEM_ROUTES)
    ]
    assert len(routes) >= 20
    unchecked = [
        f"{sorted(route.methods)} {route.path}"
        for route in routes
        if not dependency_calls(route.dependant) & {get_current_owner, get_deepl_owner}
    ]
    assert unchecked == []


def test_fresh_request_ids_take_no_random_read_per_request(make_client, monkeypatch):
    import os
    import uuid

    def no_random(*args, **kwargs):
        raise AssertionError("a random read per request")

    client = make_client()
    client.get("/health")  # the app's start-up is done
    monkeypatch.setattr(uuid, "uuid4", no_random)
    monkeypatch.setattr(os, "urandom", no_random)
    ids = [client.get("/health").headers["X-Request-ID"] for _ in range(3)]
    assert len(set(ids)) == 3
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_forked_process_makes_request_ids_of_its_own():
    import os

    from service.web import request_id

    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child writes one id of its own and leaves at once
        os.write(writer, request_id.fresh_request_id().encode())
        os._exit(0)
    os.waitpid(child, 0)
    theirs = os.read(reader, 64).decode()
    ours = request_id.fresh_request_id()
    assert theirs[:16] != ours[:16]
