"""A client that hangs up mid-request, over a real socket to uvicorn (both of its HTTP
implementations): the server hears the hang-up itself, without asking
``Request.is_disconnected``, and drops the request's rows; a keep-alive connection's next
request is answered as if the first had been alone."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from starlette.requests import Request

from service.config import Settings
from service.web.deps import run_for_client
from service.web.errors import ApiError
from tests.live_server import live_server
from tests.service_fixtures import tiny_model

SENTENCES = ["Save changes to the file.", "Open the window.", "Print the file."]
HTTP_IMPLEMENTATIONS = ("h11", "httptools")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def metric(base: str, name: str, *labels: str) -> float:
    """The value of the sample of ``name`` whose labels include each of ``labels``."""
    for line in httpx.get(f"{base}metrics", timeout=10).text.splitlines():
        if line.startswith(name) and all(label in line for label in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def translate_request(port: int, text: str) -> bytes:
    body = json.dumps({"text": text, "max_new_tokens": 64}).encode()
    head = (
        f"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One response (status and body, by its Content-Length) from a keep-alive socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), body


@pytest.mark.parametrize("http", HTTP_IMPLEMENTATIONS)
def test_a_hang_up_is_heard_without_polling_and_drops_the_rows(model_dir, monkeypatch, http):
    # A poll that never hears the hang-up, and counts that it is asked: the server must hear
    # it on its own.
    polls = []

    async def deaf_poll(self: Request) -> bool:
        polls.append(self.url.path)
        return False

    monkeypatch.setattr(Request, "is_disconnected", deaf_poll)
    # One row at a time: most of the 30 sentences are still queued when the client leaves.
    settings = Settings(
        exports=[model_dir],
        provider="cpu",
        intra_op_threads=1,
        max_batch_rows=1,
        admission_cost_aware=False,
    )
    with live_server(settings, http=http) as base:
        port = int(base.rsplit(":", 1)[1].strip("/"))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(translate_request(port, " ".join(SENTENCES * 10)))
            for _ in range(1000):
                if metric(base, "mt_inflight_rows") > 0:
                    break
                time.sleep(0.01)
            else:
                pytest.fail("the request's rows never reached the batch")
        # The socket is closed mid-request.
        for _ in range(1000):
            if metric(base, "mt_requests_total", 'status="499"') == 1:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the hang-up was not heard (no 499)")
        for _ in range(1000):
            if metric(base, "mt_inflight_rows") == 0 and metric(base, "mt_queue_depth") == 0:
                break
            time.sleep(0.01)
        assert metric(base, "mt_inflight_rows") == 0 and metric(base, "mt_queue_depth") == 0
        finished = metric(base, "mt_sentences_total")
        assert finished < 30, f"all {finished:g} sentences decoded: nothing was dropped"
    assert polls == []


@pytest.mark.parametrize("http", HTTP_IMPLEMENTATIONS)
def test_a_keep_alive_connection_answers_each_request_in_turn(model_dir, http):
    settings = Settings(exports=[model_dir], provider="cpu", intra_op_threads=1)
    with live_server(settings, http=http) as base:
        port = int(base.rsplit(":", 1)[1].strip("/"))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(60)
            for text in SENTENCES:
                sock.sendall(translate_request(port, text))
                status, body = read_response(sock)
                assert status == 200, body
                assert json.loads(body)["translations"][0]["text"]


class UnreadBodyRequest:
    """A Starlette request whose route has not read its body yet, and whose client is gone."""

    method, _stream_consumed = "POST", False

    def __init__(self) -> None:
        self.received = 0

    async def receive(self) -> dict[str, object]:
        self.received += 1
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def is_disconnected(self) -> bool:
        return True


@pytest.mark.anyio
async def test_a_route_with_its_body_unread_keeps_its_body_and_still_hears_a_hang_up():
    request = UnreadBodyRequest()
    with pytest.raises(ApiError) as refusal:
        await run_for_client(request, None, asyncio.sleep(60))  # type: ignore[arg-type]
    assert refusal.value.status == 499
    assert request.received == 0  # the body's messages are left to the route
