"""Hostile-but-fair input against the real server (uvicorn on a loopback socket, the tiny real
model): no 5xx for any client input, a JSON error body with a message for every 4xx, and the
service healthy and translating afterwards.

Two halves:

* hand-written cases for what a schema-driven generator does not produce: unpaired UTF-16
  surrogate escapes, NUL bytes, a 1 MB word, deep JSON nesting, huge numbers, wrong or
  missing content types, invalid UTF-8, repeated form fields, a body that trickles in slowly
  and one that never finishes;
* schemathesis against the app's own OpenAPI schema, positive and negative (schema-violating)
  cases for every operation: a bounded, derandomized run here (``MT_FUZZ_EXAMPLES`` per
  operation, default 25); ``make fuzz`` runs the long one and writes the case count to
  ``MT_FUZZ_REPORT``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from service.config import Settings
from service.wiring import create_app
from tests.live_server import live_server
from tests.service_fixtures import tiny_model

FUZZ_EXAMPLES = int(os.environ.get("MT_FUZZ_EXAMPLES", "25"))
FUZZ_REPORT = os.environ.get("MT_FUZZ_REPORT")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    settings = Settings(
        exports=[tiny_model(tmp_path_factory)],
        provider="cpu",
        intra_op_threads=1,
        max_body_bytes=2_000_000,  # a 1 MB word gets past the body limit to the text limits
        max_input_tokens=64,
        max_new_tokens=16,
        max_texts_per_request=16,
        request_timeout_s=30,
        data_dir=tmp_path_factory.mktemp("data"),  # stored glossaries and document jobs
    )
    with live_server(settings) as url:
        yield url.rstrip("/")


@pytest.fixture(scope="module")
def http(server_url):
    with httpx.Client(base_url=server_url, trust_env=False, timeout=60.0) as client:
        yield client


def assert_client_error_is_json_or_success(response: httpx.Response) -> None:
    """The invariant: below 500, and every 4xx a JSON object with a non-empty message."""
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]
        assert "Traceback" not in response.text and "/work/" not in response.text


def post_raw(http: httpx.Client, path: str, body: bytes, content_type: str | None):
    headers = {"content-type": content_type} if content_type else {}
    return http.post(path, content=body, headers=headers)


JSON = "application/json"
FORM = "application/x-www-form-urlencoded"

# (path, raw body, content type, statuses allowed): the body bytes exactly as sent.
RAW_CASES = {
    "unpaired high surrogate in text": ("/v1/translate", rb'{"text": "Save \ud800 now"}', JSON, {422}),
    "unpaired low surrogate in a list": ("/v1/translate", rb'{"text": ["ok", "\udc00"]}', JSON, {422}),
    "surrogate in the target language": (
        "/v1/translate", rb'{"text": "x", "target_lang": "\ud800"}', JSON, {422},
    ),
    "surrogate in an unknown field name": ("/v1/translate", rb'{"text": "x", "\ud800": 1}', JSON, {422}),
    "paired surrogates are an emoji": ("/v1/translate", rb'{"text": "Save \ud83d\ude00"}', JSON, {200}),
    "libretranslate surrogate in q": ("/translate", rb'{"q": "a\ud800", "source": "en"}', JSON, {400}),
    "libretranslate surrogate in target": ("/translate", rb'{"q": "a", "target": "\udfff"}', JSON, {400}),
    "libretranslate surrogate in api_key": ("/translate", rb'{"q": "a", "api_key": "\ud800"}', JSON, {400}),
    "deepl surrogate in text": (
        "/v2/translate", rb'{"text": ["ab\ud800cd"], "target_lang": "DE"}', JSON, {400},
    ),
    "deepl glossary surrogate in name": (
        "/v2/glossaries",
        rb'{"name": "\ud800", "source_lang": "en", "target_lang": "de", "entries": "a\tb"}',
        JSON, {400},
    ),
    "deepl glossary surrogate in entries": (
        "/v2/glossaries",
        rb'{"name": "n", "source_lang": "en", "target_lang": "de", "entries": "a\tb\udc00"}',
        JSON, {400},
    ),
    "glossary surrogate in name": (
        "/v1/glossaries",
        rb'{"name": "\ud800", "source_lang": "en", "target_lang": "de", "entries": {"a": "b"}}',
        JSON, {400},
    ),
    "memory surrogate in an entry": (
        "/v1/memories", rb'{"source_lang": "en", "target_lang": "de", "entries": {"a": "\ud800"}}',
        JSON, {400, 422},
    ),
    # Form values are decoded with replacement characters (as LibreTranslate's werkzeug does).
    "form surrogate bytes (CESU-8)": ("/translate", b"q=%ED%A0%80&source=en", FORM, {200}),
    "form invalid utf-8": ("/translate", b"q=%FF%FE&source=en", FORM, {200}),
    "escaped NUL in text": ("/v1/translate", rb'{"text": "Save\u0000changes"}', JSON, {200}),
    "raw NUL byte in JSON": ("/v1/translate", b'{"text": "Save\x00changes"}', JSON, {400}),
    "libretranslate NUL in q": ("/translate", rb'{"q": "\u0000"}', JSON, {200}),
    # Found by the long `make fuzz` run: an empty HTML fragment gave 500.
    "libretranslate empty html": ("/translate", rb'{"q": "", "format": "html"}', JSON, {400}),
    "libretranslate empty html in a list": (
        "/translate", rb'{"q": ["", "<b>Save</b>"], "format": "html"}', JSON, {200},
    ),
    "libretranslate empty detect": ("/detect", rb'{"q": ""}', JSON, {400}),
    "form NUL in q": ("/translate", b"q=a%00b", FORM, {200}),
    "1 MB word": ("/v1/translate", b'{"text": "' + b"a" * 1_000_000 + b'"}', JSON, {413}),
    "1 MB word, libretranslate": ("/translate", b'{"q": "' + b"b" * 1_000_000 + b'"}', JSON, {413}),
    "deep array nesting": ("/v1/translate", b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON, {400, 422}),
    "deep object nesting, libretranslate": ("/translate", b'{"q": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001, JSON, {400}),
    "integer of 5000 digits": ("/v1/translate", b'{"text": "x", "beam_size": ' + b"9" * 5000 + b"}", JSON, {400, 422}),
    "huge float": ("/v1/translate", b'{"text": "x", "max_new_tokens": 1e400}', JSON, {422}),
    "NaN": ("/v1/translate", b'{"text": "x", "beam_size": NaN}', JSON, {400, 422}),
    "huge beam": ("/v1/translate", b'{"text": "x", "beam_size": 1000000000000}', JSON, {422}),
    "negative tokens": ("/v1/translate", b'{"text": "x", "max_new_tokens": -1}', JSON, {422}),
    "text/plain body": ("/v1/translate", b'{"text": "x"}', "text/plain", {200, 415, 422}),
    "xml body": ("/v1/translate", b"<text>x</text>", "application/xml", {400, 415, 422}),
    "no content type": ("/v1/translate", b'{"text": "x"}', None, {200, 415, 422}),
    "latin-1 bytes as JSON": ("/v1/translate", b'{"text": "caf\xe9"}', JSON, {400, 422}),
    "BOM before JSON": ("/v1/translate", b'\xef\xbb\xbf{"text": "x"}', JSON, {200, 400}),
    "empty body": ("/v1/translate", b"", JSON, {400, 422}),
    "JSON null": ("/v1/translate", b"null", JSON, {400, 422}),
    "JSON array": ("/translate", b'["q"]', JSON, {400}),
    "multipart to the v1 API": ("/v1/translate", b"--x\r\n\r\n--x--", "multipart/form-data; boundary=x", {400, 415, 422}),
    "broken multipart": ("/translate", b"--x\r\nContent-Disposition: form-data\r\n", "multipart/form-data; boundary=x", {400}),
    "multipart without boundary": ("/translate", b"q=a", "multipart/form-data", {400}),
    "too many texts": ("/v1/translate", json.dumps({"text": ["a"] * 1000}).encode(), JSON, {413}),
    "repeated q": ("/translate", b"q=Save&q=Open&source=en", FORM, {200}),
    "repeated source": ("/translate", b"q=Save&source=en&source=fr", FORM, {200, 400}),
    "repeated format": ("/translate", b"q=Save&format=text&format=xml", FORM, {200, 400}),
    "repeated JSON key": ("/v1/translate", b'{"text": "a", "text": 5}', JSON, {422}),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RAW_CASES))
def test_hostile_body_gets_a_clear_answer_never_a_5xx(http, case):
    path, body, content_type, allowed = RAW_CASES[case]
    response = post_raw(http, path, body, content_type)
    assert_client_error_is_json_or_success(response)
    assert response.status_code in allowed, (response.status_code, response.text[:300])


def test_an_unpaired_surrogate_error_names_the_field_and_the_code_point(http):
    response = post_raw(http, "/v1/translate", rb'{"text": ["ok", "a\udbff"]}', JSON)
    assert response.status_code == 422
    message = response.json()["error"]
    assert "text" in message and "U+DBFF" in message and "text 1" in message


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send one request on a kept-alive connection and read its whole response."""
    sock.sendall(request)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection: {received[:200]!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v2/translate", rb'{"text": "ab\ud800cd", "target_lang": "DE"}'),
        ("/v2/glossaries", rb'{"name": "\udbff", "source_lang": "EN", "target_lang": "DE"}'),
    ],
)
def test_a_surrogate_on_the_deepl_routes_is_400_and_the_connection_stays_usable(
    server_url, path, body
):
    host, port = urlsplit(server_url).hostname, urlsplit(server_url).port

    def request(path: str, body: bytes) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    with socket.create_connection((host, port), timeout=30) as sock:
        status, answer = _exchange(sock, request(path, body))
        assert status == 400 and b"U+D" in answer, answer
        good = json.dumps({"text": ["Save changes"], "target_lang": "DE"}).encode()
        status, answer = _exchange(sock, request("/v2/translate", good))
        assert status == 200, answer


def _raw_request(url: str, head: bytes, body_chunks: list[bytes], pause_s: float) -> bytes:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(head)
        for chunk in body_chunks:
            time.sleep(pause_s)
            sock.sendall(chunk)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_a_slow_body_is_answered_and_others_are_served_meanwhile(server_url, http):
    body = json.dumps({"text": "Save changes"}).encode()
    head = (
        b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    answers: list[bytes] = []
    slow = threading.Thread(
        target=lambda: answers.append(
            _raw_request(server_url, head, [body[i : i + 3] for i in range(0, len(body), 3)], 0.1)
        )
    )
    slow.start()
    fast = http.post("/v1/translate", json={"text": "Open"})
    slow.join(60)
    assert fast.status_code == 200
    assert answers and answers[0].startswith(b"HTTP/1.1 200"), answers[:1]


def test_a_body_that_never_finishes_does_not_hurt_the_server(server_url, http):
    host, port = urlsplit(server_url).hostname, urlsplit(server_url).port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"q": "abc'
        )
        assert http.post("/translate", json={"q": "Save"}).status_code == 200
    # The half-sent request's connection is gone; the service goes on.
    assert http.get("/health").status_code == 200


# Runs that made the text path's patterns quadratic, at the largest size a text may have.
ADVERSARIAL_RUNS = ["a", "1", ".", "%0", " ", "{%", "1,", "<a ", "a@", " \t"]


@pytest.mark.parametrize("unit", ADVERSARIAL_RUNS)
def test_adversarial_text_is_answered_quickly_and_never_a_5xx(http, unit):
    run = (unit * 5000)[:5000]
    started = time.monotonic()
    for path, body in (
        ("/v1/translate", {"text": [run] * 16, "source_lang": "auto"}),
        ("/translate", {"q": [run] * 16, "source": "auto", "target": "de"}),
        ("/detect", {"q": [run] * 16}),
    ):
        assert_client_error_is_json_or_success(http.post(path, json=body))
    assert time.monotonic() - started < 30


def _lying_archives() -> list[tuple[str, bytes]]:
    from tests.text.test_documents import lying_zip

    return [
        ("bzip2.docx", lying_zip(zipfile.ZIP_BZIP2, 100, 1 << 24)),
        ("deflate.docx", lying_zip(zipfile.ZIP_DEFLATED, 100, 1 << 24)),
    ]


@pytest.mark.parametrize("path", ["/translate_file", "/v1/documents"])
def test_archives_that_lie_about_their_sizes_are_refused_at_upload(http, path):
    for name, content in _lying_archives():
        data = {"source": "en", "target": "de", "target_lang": "de"}
        response = http.post(path, data=data, files={"file": (name, content)})
        assert_client_error_is_json_or_success(response)
        assert response.status_code == 400, (name, response.text)


def test_the_service_is_healthy_and_translates_after_the_hostile_cases(http):
    assert http.get("/health").status_code == 200
    assert http.get("/ready").status_code == 200
    response = http.post("/v1/translate", json={"text": "Save changes"})
    assert response.status_code == 200 and response.json()["translations"][0]["text"]


# --- schemathesis ------------------------------------------------------------------------------

# The schema the app serves at /openapi.json, built without loading a model (no lifespan), so
# the operations can parametrize the test at collection time.
API_SCHEMA = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
OPERATIONS = [result.ok() for result in API_SCHEMA.get_all_operations()]
# Negative (schema-violating) cases need an input to violate: the GET operations take none.
CASES = [(operation, GenerationMode.POSITIVE) for operation in OPERATIONS] + [
    (operation, GenerationMode.NEGATIVE)
    for operation in OPERATIONS
    if operation.method.upper() == "POST"
]
_cases_sent = 0


@pytest.mark.parametrize(
    ("operation", "mode"), CASES, ids=[f"{op.label} {mode}" for op, mode in CASES]
)
def test_generated_requests_get_no_5xx_and_json_errors(server_url, operation, mode):
    @settings(
        max_examples=FUZZ_EXAMPLES,
        derandomize=True,  # the same cases every run: a failure here is reproducible
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case) -> None:
        global _cases_sent
        response = case.call(base_url=server_url, timeout=60)
        _cases_sent += 1
        assert response.status_code < 500, (case.method, case.path, response.text[:300])
        if response.status_code >= 400:
            body = response.json()
            assert isinstance(body, dict) and body.get("error"), response.text[:300]

    check()


def test_healthy_after_the_generated_requests(http):
    assert http.get("/health").status_code == 200
    assert http.post("/v1/translate", json={"text": "Open"}).status_code == 200
    if FUZZ_REPORT:
        report = Path(FUZZ_REPORT)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(
            json.dumps(
                {
                    "examples_per_operation_and_mode": FUZZ_EXAMPLES,
                    "operations": [operation.label for operation in OPERATIONS],
                    "cases_sent": _cases_sent,
                }
            )
        )
