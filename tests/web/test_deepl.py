"""DeepL API v2 beyond glossaries (those are in test_glossary.py): ``formality`` and
``context`` checked as DeepL checks them, in JSON and form bodies; DeepL's statuses and
``message`` for a bad key (403), too many requests (429: the rate limits and the in-flight
bound) and the character quota (456, per key and month, across a restart), and the official
client's exceptions for them.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.wiring import create_app
from tests.service_fixtures import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def make_settings(model_dir, data_dir, **overrides) -> Settings:
    return Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=16,
        data_dir=data_dir,
        **overrides,
    )


def ready(client: TestClient) -> TestClient:
    import time

    for _ in range(3000):
        if client.get("/ready").status_code == 200:
            return client
        time.sleep(0.01)
    raise AssertionError("never ready")


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory):
    settings = make_settings(model_dir, tmp_path_factory.mktemp("deepl_data"))
    with TestClient(create_app(settings)) as test_client:
        yield ready(test_client)


def translate(client: TestClient, form: bool, **fields):
    body = {"text": ["Save the file."], "target_lang": "DE", **fields}
    return (
        client.post("/v2/translate", data=body) if form else client.post("/v2/translate", json=body)
    )


@pytest.mark.parametrize("form", [False, True])
def test_formality_is_checked_as_deepl_does_for_a_target_without_formality(client, form):
    plain = translate(client, form).json()["translations"][0]["text"]
    # /v2/languages says no target supports formality ...
    targets = client.get("/v2/languages", params={"type": "target"}).json()
    assert targets and not any(lang["supports_formality"] for lang in targets)
    # ... so the prefer_ values fall back to the default, as DeepL's do, and change nothing,
    for formality in ("default", "prefer_more", "prefer_less"):
        response = translate(client, form, formality=formality)
        assert response.status_code == 200, response.text
        assert response.json()["translations"][0]["text"] == plain
    # and the strict ones fail there, as DeepL's do; an unknown value is a 400 too.
    for formality in ("more", "less"):
        response = translate(client, form, formality=formality)
        assert response.status_code == 400, response.text
        assert response.json()["message"] == "'formality' is not supported for given 'target_lang'."
    unknown = translate(client, form, formality="very")
    assert unknown.status_code == 400
    assert unknown.json()["message"] == "Value for 'formality' not supported."


@pytest.mark.parametrize("form", [False, True])
def test_context_is_accepted_not_billed_and_changes_nothing(client, form):
    plain = translate(client, form).json()["translations"][0]
    with_context = translate(client, form, context="A dialog of a text editor.")
    assert with_context.status_code == 200, with_context.text
    assert with_context.json()["translations"][0] == plain  # billed_characters too
    assert plain["billed_characters"] == len("Save the file.")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"context": 3}, "Parameter 'context' must be a string"),
        ({"tag_handling": "markdown"}, "Value for 'tag_handling' not supported."),
        ({"split_sentences": "2"}, "Value for 'split_sentences' not supported."),
        ({"translation_memory_threshold": 101}, None),
        ({"translation_memory_id": "missing"}, None),
    ],
)
def test_bad_options_are_deepls_4xx(client, fields, message):
    response = translate(client, False, **fields)
    assert 400 <= response.status_code < 500, response.text
    assert message is None or response.json()["message"] == message


def test_options_deepl_clients_send_are_accepted(client):
    for fields in (
        {"split_sentences": "nonewlines", "preserve_formatting": True},
        {"split_sentences": "0", "preserve_formatting": "1", "tag_handling": "xml"},
    ):
        assert translate(client, False, **fields).status_code == 200
    assert translate(client, True, split_sentences="1", preserve_formatting="0").status_code == 200


# --- keys and too many requests ----------------------------------------------------------------


def test_a_bad_or_missing_key_is_403_with_deepls_message(model_dir, tmp_path):
    settings = make_settings(model_dir, tmp_path, api_keys="k1")
    with TestClient(create_app(settings)) as keyed:
        ready(keyed)
        body = {"text": ["Save."], "target_lang": "DE"}
        good = keyed.post(
            "/v2/translate", json=body, headers={"Authorization": "DeepL-Auth-Key k1"}
        )
        assert good.status_code == 200
        for headers in ({"Authorization": "DeepL-Auth-Key k2"}, {}):
            for path, method in (("/v2/translate", "post"), ("/v2/usage", "get")):
                kwargs = {"json": body} if method == "post" else {}
                response = getattr(keyed, method)(path, headers=headers, **kwargs)
                assert response.status_code == 403, (path, headers, response.text)
                assert response.json()["message"]


def test_too_many_requests_is_429_with_retry_after_and_deepls_message(model_dir, tmp_path):
    settings = make_settings(model_dir, tmp_path, rate_limit_requests_per_minute=2)
    with TestClient(create_app(settings)) as limited:
        ready(limited)
        body = {"text": ["Save."], "target_lang": "DE"}
        statuses = [limited.post("/v2/translate", json=body).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        refused = limited.post("/v2/translate", data=body)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["message"].startswith("Slowdown")


def test_the_official_client_raises_its_own_exceptions(model_dir, tmp_path, monkeypatch):
    deepl = pytest.importorskip("deepl")
    from tests.live_server import live_server

    # The client retries a 429 with back-off five times; once shows the mapping.
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
    settings = make_settings(model_dir, tmp_path, api_keys="k1", rate_limit_requests_per_minute=1)
    with live_server(settings) as base:
        translator = deepl.Translator("k1", server_url=base.rstrip("/"))
        assert translator.translate_text("Save.", target_lang="DE", formality="prefer_less").text
        with pytest.raises(deepl.TooManyRequestsException):
            translator.translate_text("Save.", target_lang="DE")
        with pytest.raises(deepl.AuthorizationException):
            deepl.Translator("k2", server_url=base.rstrip("/")).translate_text(
                "Save.", target_lang="DE"
            )


def test_in_flight_bound_answers_v2_in_deepls_shape(model_dir, tmp_path):
    from service.web.inflight import InflightGate

    gate = InflightGate(None, max_in_flight=0, retry_after_s=3, metrics=_metrics())  # type: ignore[arg-type]
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    import asyncio
    import json

    scope = {"type": "http", "method": "POST", "path": "/v2/translate"}
    asyncio.run(gate(scope, None, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 429
    body = json.loads(sent[1]["body"])
    assert body["message"] == body["error"] and "MT_MAX_INFLIGHT_REQUESTS" in body["message"]


def _metrics():
    from service.metrics import ServiceMetrics

    return ServiceMetrics()


# --- the character quota -----------------------------------------------------------------------


def test_the_quota_is_456_past_the_limit_per_key_and_month_and_survives_a_restart(
    model_dir, tmp_path
):
    settings = make_settings(model_dir, tmp_path, api_keys="k1,k2", deepl_character_limit=20)
    k1 = {"Authorization": "DeepL-Auth-Key k1"}
    k2 = {"Authorization": "DeepL-Auth-Key k2"}
    with TestClient(create_app(settings)) as first:
        ready(first)
        body = {"text": ["Save the file."], "target_lang": "DE"}  # 14 characters
        assert first.post("/v2/translate", json=body, headers=k1).status_code == 200
        assert first.get("/v2/usage", headers=k1).json()["character_count"] == 14
        assert first.get("/v2/usage", headers=k1).json()["character_limit"] == 20
        over = first.post("/v2/translate", data=body, headers=k1)  # 28 > 20
        assert over.status_code == 456
        assert over.json()["message"] == "Quota exceeded. The character limit has been reached."
        assert first.get("/v2/usage", headers=k1).json()["character_count"] == 14  # not counted
        short = {"text": ["Save."], "target_lang": "DE"}  # 19 <= 20: still allowed
        assert first.post("/v2/translate", json=short, headers=k1).status_code == 200
        assert first.post("/v2/translate", json=body, headers=k2).status_code == 200  # own quota
    with TestClient(create_app(settings)) as second:
        ready(second)
        assert second.get("/v2/usage", headers=k1).json()["character_count"] == 19
        refused = second.post(
            "/v2/translate", json={"text": ["Hi there"], "target_lang": "DE"}, headers=k1
        )
        assert refused.status_code == 456


def test_the_quota_starts_again_each_month(tmp_path):
    from service.storage.sqlite import FILE_NAME, SqliteDatabase
    from service.web.errors import ApiError
    from service.web.quota import CharacterQuota

    now = [1_767_225_599.0]  # 2025-12-31 23:59:59 UTC
    quota = CharacterQuota(SqliteDatabase(tmp_path / FILE_NAME), limit=10, clock=lambda: now[0])
    quota.record("key:a", 10, 1)
    with pytest.raises(ApiError) as refused:
        quota.check("key:a", 1)
    assert refused.value.status == 456
    quota.check("key:b", 10)  # another client's own quota
    now[0] += 1  # 2026-01-01
    quota.check("key:a", 10)
    assert quota.usage("key:a").characters == 0


def test_the_official_client_sees_the_quota(model_dir, tmp_path):
    deepl = pytest.importorskip("deepl")
    from tests.live_server import live_server

    settings = make_settings(model_dir, tmp_path, api_keys="k1", deepl_character_limit=10)
    with live_server(settings) as base:
        translator = deepl.Translator("k1", server_url=base.rstrip("/"))
        assert translator.translate_text("Save it.", target_lang="DE").text  # 8 of 10
        usage = translator.get_usage()
        assert (usage.character.count, usage.character.limit) == (8, 10)
        assert not usage.any_limit_reached
        with pytest.raises(deepl.QuotaExceededException):
            translator.translate_text("Open the file.", target_lang="DE")
        translator.translate_text("Ok", target_lang="DE")
        assert translator.get_usage().any_limit_reached
