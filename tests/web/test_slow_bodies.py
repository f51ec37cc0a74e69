"""Slow bodies hold no in-flight slot: a translation request's body is read before it takes
an in-flight slot, within MT_BODY_READ_TIMEOUT_S (408 after), and a key sent in a header is
checked before the body is read. Raw sockets play the slow clients."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from service.config import Settings
from tests.live_server import live_server
from tests.service_fixtures import tiny_model

HEAD = (
    b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 500\r\n"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def _trickle(url: str, answers: list[bytes], stop: threading.Event) -> None:
    """Headers, then one byte of a 500-byte body every 0.2 s until answered or stopped."""
    with _connect(url) as sock:
        sock.sendall(HEAD + b"\r\n")
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                answer = sock.recv(65536)
                answers.append(answer)
                return
            except TimeoutError:
                pass
            try:
                sock.sendall(b" ")
            except OSError:
                return


def test_clients_trickling_bodies_do_not_shut_out_a_translation(model_dir, tmp_path):
    settings = Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=8,
        max_inflight_requests=1,
        body_read_timeout_s=2.0,
        data_dir=tmp_path,
    )
    with live_server(settings) as url:
        answers: list[bytes] = []
        stop = threading.Event()
        slow = [threading.Thread(target=_trickle, args=(url, answers, stop)) for _ in range(3)]
        for thread in slow:
            thread.start()
        time.sleep(0.5)  # every slow body is being read
        try:
            fast = httpx.post(f"{url}v1/translate", json={"text": "Save"}, timeout=30)
            assert fast.status_code == 200, fast.text
            for thread in slow:
                thread.join(10)
        finally:
            stop.set()
        # Each slow client is cut off once its body has taken the time limit.
        assert len(answers) == 3
        assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers), answers
        assert b"MT_BODY_READ_TIMEOUT_S" in answers[0]


def test_a_wrong_key_in_a_header_is_refused_before_the_body(model_dir, tmp_path):
    settings = Settings(
        exports=[model_dir], provider="cpu", intra_op_threads=1, api_keys="good", data_dir=tmp_path
    )
    with live_server(settings) as url:
        for head, status in (
            (HEAD + b"Authorization: Bearer wrong\r\n", b"403"),
            (HEAD, b"401"),  # /v1 takes its key only from the header
            (HEAD.replace(b"/v1/translate", b"/v2/translate"), b"403"),
        ):
            with _connect(url) as sock:
                sock.sendall(head + b"\r\n")  # and no body at all
                answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 " + status), answer


@pytest.mark.parametrize("path", ["/v1/documents", "/v2/document"])
def test_uploads_count_against_the_in_flight_bound(path):
    """An upload's parsing and checks take a worker thread as a translation does: with every
    slot taken it is refused at once, its body unread."""
    import asyncio

    from service.metrics import ServiceMetrics
    from service.web.inflight import InflightGate

    async def unreachable(scope, receive, send):
        raise AssertionError("the upload got past a full gate")

    gate = InflightGate(unreachable, max_in_flight=1, retry_after_s=1, metrics=ServiceMetrics())
    gate.in_flight = 1
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(gate({"type": "http", "method": "POST", "path": path}, None, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 429
