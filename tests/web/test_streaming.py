"""``POST /v1/translate/stream`` read as server-sent events by an HTTP client (httpx), against the
real app and the tiny real model: order, completeness against ``/v1/translate``, ``[DONE]``,
errors after the start, and a client that hangs up (its rows freed, by the metrics)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.text.segmenter import sentence_spans
from service.wiring import create_app
from tests.live_server import live_server
from tests.service_fixtures import tiny_model

SENTENCES = [
    "Save changes to the file.",
    "Open the window.",
    "Close all files in this folder now.",
    "Delete.",
    "Search and replace in the window.",
    "Print the file.",
]
TEXT = " ".join(SENTENCES[:3]) + "\n" + " ".join(SENTENCES[3:])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def make_settings(model_dir, **overrides) -> Settings:
    return Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=64,
        # Every row joins at once, so a row's finishing step follows from its length.
        admission_cost_aware=False,
        **overrides,
    )


def wait_ready(client: TestClient) -> None:
    for _ in range(3000):
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError("never ready")


@pytest.fixture(scope="module")
def client(model_dir):
    with TestClient(create_app(make_settings(model_dir))) as test_client:
        wait_ready(test_client)
        yield test_client


def parse_events(lines) -> list[tuple[str, str]]:
    """``(event name, data)`` per server-sent event; comments (pings) skipped."""
    events, name, data = [], "message", []
    for line in lines:
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        events.append((name, "\n".join(data)))
    return events


def stream(client, body: dict) -> list[tuple[str, str]]:
    with client.stream("POST", "/v1/translate/stream", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse_events(response.iter_lines())


def test_one_event_per_sentence_then_the_whole_response_then_done(client):
    events = stream(client, {"text": TEXT, "beam_size": 1})
    names = [name for name, _ in events]
    assert names == ["sentence"] * len(SENTENCES) + ["done", "message"]
    assert events[-1][1] == "[DONE]"
    sentences = [json.loads(data) for name, data in events if name == "sentence"]
    assert sorted(s["index"] for s in sentences) == list(range(len(SENTENCES)))
    assert {(s["text"], s["sentences"]) for s in sentences} == {(0, len(SENTENCES))}

    # Completeness: the final event is exactly the non-streaming response, and each sentence
    # event is that sentence's translation (a sentence translates alike alone or in a text).
    done = json.loads(events[-2][1])
    whole = client.post("/v1/translate", json={"text": TEXT}).json()
    assert done["translations"] == whole["translations"]
    assert (done["model"], done["usage"]) == (whole["model"], whole["usage"])
    alone = client.post("/v1/translate", json={"text": SENTENCES}).json()["translations"]
    for event in sentences:
        assert event["translation"] == alone[event["index"]]["text"]
        assert event["tokens"] == alone[event["index"]]["tokens"]
    # Order: all rows joined at one step and a row takes one step per token (greedy), so
    # the events come in the order the rows finished: by generated length.
    assert [s["tokens"] for s in sentences] == sorted(s["tokens"] for s in sentences)


def test_a_list_of_texts_streams_every_sentence_with_its_text_index(client):
    texts = ["Save changes. Open the window.", "", "Print the file."]
    events = stream(client, {"text": texts})
    sentences = [json.loads(data) for name, data in events if name == "sentence"]
    assert sorted((s["text"], s["index"]) for s in sentences) == [(0, 0), (0, 1), (2, 0)]
    done = json.loads(next(data for name, data in events if name == "done"))
    expected = client.post("/v1/translate", json={"text": texts}).json()["translations"]
    assert done["translations"] == expected
    assert [len(sentence_spans(t)) for t in texts] == [t["sentences"] for t in expected]


def test_refusals_before_the_stream_starts_are_plain_json_errors(client):
    response = client.post("/v1/translate/stream", json={"text": "Save", "beam_size": 99})
    assert response.status_code == 422
    assert "MT_MAX_BEAM_SIZE" in response.json()["error"]
    response = client.post("/v1/translate/stream", json={"text": []})
    assert response.status_code == 422


def test_a_failure_after_the_start_is_an_error_event_without_done(model_dir):
    settings = make_settings(model_dir, request_timeout_s=0.001)
    with TestClient(create_app(settings)) as timed:
        wait_ready(timed)
        events = stream(timed, {"text": TEXT, "max_new_tokens": 64})
    assert events[-1][0] == "error"
    error = json.loads(events[-1][1])
    assert (error["status"], error["code"]) == (504, "timeout")
    assert "MT_REQUEST_TIMEOUT_S" in error["error"]
    assert ("message", "[DONE]") not in events


def metric(base: str, name: str) -> float:
    """One sample's value from /metrics (``name`` with its labels, as Prometheus prints it)."""
    for line in httpx.get(f"{base}metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_hangs_up_has_its_rows_dropped(model_dir):
    # Two rows at a time: most sentences are still queued when the client leaves.
    settings = make_settings(model_dir, max_batch_rows=2)
    many = " ".join(SENTENCES * 5)  # 30 sentences
    with live_server(settings) as base:
        with httpx.stream(
            "POST", f"{base}v1/translate/stream", json={"text": many, "max_new_tokens": 64}
        ) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("event:"))
            assert first == "event: sentence"
        # The connection is closed: the server notices and drops the request's rows.
        for _ in range(1000):
            disconnected = metric(base, 'mt_rejections_total{reason="client_disconnected"}')
            if disconnected and metric(base, "mt_inflight_rows") == 0:
                break
            time.sleep(0.01)
        assert disconnected == 1
        assert metric(base, "mt_inflight_rows") == 0
        assert metric(base, "mt_queue_depth") == 0
        finished = metric(base, "mt_sentences_total")
        assert finished < 30, f"all {finished:g} sentences decoded: nothing was dropped"
