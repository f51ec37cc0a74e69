"""MT_LOG_FORMAT=json: one JSON object per log line, and one record per request with its id,
route, status, model, latency, characters and the client's key id, never the key."""

from __future__ import annotations

import io
import json
import logging

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.web.request_log import JsonFormatter, key_id
from service.wiring import create_app
from tests.service_fixtures import tiny_model

API_KEY = "secret-key-4711"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture
def json_log(caplog):
    """What the root logger writes, through the JSON formatter."""
    caplog.set_level(logging.INFO)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    logging.getLogger().addHandler(handler)
    yield buffer
    logging.getLogger().removeHandler(handler)


def serve(model_dir, tmp_path, **overrides) -> TestClient:
    settings = Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        data_dir=tmp_path / "data",
        api_keys=API_KEY,
        **overrides,
    )
    return TestClient(create_app(settings))


def test_json_logs_have_a_record_per_request_with_its_facts(model_dir, tmp_path, json_log):
    text = "Save the file."
    with serve(model_dir, tmp_path, log_format="json") as client:
        while client.get("/ready").status_code != 200:
            pass
        response = client.post(
            "/v1/translate", json={"text": text}, headers={"Authorization": f"Bearer {API_KEY}"}
        )
        assert response.status_code == 200, response.text
        refused = client.post("/v1/translate", json={"text": text})
        assert refused.status_code == 401
    lines = [line for line in json_log.getvalue().splitlines() if line]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    requests = [r for r in records if r["logger"] == "mtserve.requests"]
    [served] = [r for r in requests if r["route"] == "/v1/translate" and r["status"] == 200]
    assert served["request_id"] == response.headers["x-request-id"]
    assert served["model"] == response.headers["x-translation-models"]
    assert served["latency_ms"] > 0 and served["characters"] == len(text)
    assert served["key_id"] == key_id(API_KEY)
    [anonymous] = [r for r in requests if r["status"] == 401]
    assert anonymous["key_id"] is None and anonymous["model"] is None
    assert API_KEY not in json_log.getvalue()


def test_plain_text_stays_the_default(model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with serve(model_dir, tmp_path) as client:
        client.get("/health")
    assert not [r for r in caplog.records if r.name == "mtserve.requests"]
