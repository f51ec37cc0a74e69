"""A minimal HTTP/1.1 client on asyncio streams, for load that outruns httpx.

At a few hundred requests per second with hundreds of connections open, httpx's pool costs
more CPU than the service it measures, and on a shared 2-core machine the generator then
starves the server (measured: the generator's process at 80-90 % of a core, the server
idle, every latency queued inside the client). This client keeps only what the load tests
need: keep-alive connections reused from a free list, ``Content-Length`` bodies (the service
never sends chunked responses to these requests), one timeout per request.

It quacks like the part of ``httpx.AsyncClient`` the scripts use (``post(url, json=...)``,
``get(url)``, responses with ``status_code``, ``headers``, ``text``, ``json()``), and raises
``httpx`` transport errors, so the scripts' error handling stays one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx


class RawResponse:
    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class RawClient:
    """Keep-alive HTTP/1.1 to one host; at most ``max_connections`` open at once."""

    def __init__(self, base_url: str, max_connections: int, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout_s = timeout_s
        self._free: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for connection in self._free:
            connection.close()
        self._free.clear()

    async def post(self, url: str, *, json: Mapping[str, Any], timeout: float | None = None):
        body = _dumps(json)
        return await self._request("POST", url, body, timeout)

    async def get(self, url: str, *, timeout: float | None = None) -> RawResponse:
        return await self._request("GET", url, b"", timeout)

    async def _request(
        self, method: str, url: str, body: bytes, timeout: float | None
    ) -> RawResponse:
        path = urlsplit(url).path or "/"
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        async with self._slots:
            connection = None
            try:
                async with asyncio.timeout(timeout or self.timeout_s):
                    reused = bool(self._free)
                    connection = self._free.pop() if reused else await self._connect()
                    try:
                        connection.writer.write(head + body)
                        response, keep_alive = await _read_response(connection.reader)
                    except (OSError, asyncio.IncompleteReadError):
                        if not reused:
                            raise
                        # The server closed this idle keep-alive connection as we reused it
                        # (its keep-alive timeout): not an answer; send again on a new one,
                        # as HTTP clients do.
                        connection.close()
                        connection = await self._connect()
                        connection.writer.write(head + body)
                        response, keep_alive = await _read_response(connection.reader)
            except TimeoutError as error:
                if connection:
                    connection.close()
                raise httpx.ReadTimeout(
                    f"no response within {timeout or self.timeout_s} s"
                ) from error
            except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                if connection:
                    connection.close()
                raise httpx.ReadError(f"{type(error).__name__}: {error}") from error
            if keep_alive:
                self._free.append(connection)
            else:
                connection.close()
            return response

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=2**22)
        except OSError as error:
            raise httpx.ConnectError(f"{type(error).__name__}: {error}") from error
        return _Connection(reader, writer)


class RawClients:
    """A :class:`RawClient` per host and port, behind one ``post``/``get``: for a generator
    that talks to several services at once (``compare --interleave``). HTTPS targets (which
    the raw client does not speak) go through one ``httpx.AsyncClient``."""

    def __init__(self, max_connections: int, timeout_s: float) -> None:
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._clients: dict[tuple[str | None, int | None], RawClient | httpx.AsyncClient] = {}

    async def __aenter__(self) -> RawClients:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    def _for(self, url: str) -> RawClient | httpx.AsyncClient:
        parts = urlsplit(url)
        key = (parts.hostname, parts.port) if parts.scheme != "https" else ("https", None)
        if key not in self._clients:
            if parts.scheme == "https":
                self._clients[key] = httpx_client(self.max_connections, self.timeout_s)
            else:
                origin = f"http://{parts.netloc}"
                self._clients[key] = RawClient(origin, self.max_connections, self.timeout_s)
        return self._clients[key]

    async def post(self, url: str, *, json: Mapping[str, Any], timeout: float | None = None):
        return await self._for(url).post(url, json=json, timeout=timeout)

    async def get(self, url: str, *, timeout: float | None = None) -> RawResponse | httpx.Response:
        return await self._for(url).get(url, timeout=timeout)


async def _read_response(reader: asyncio.StreamReader) -> tuple[RawResponse, bool]:
    status_line = await reader.readuntil(b"\r\n")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    content = await reader.readexactly(length) if length else b""
    keep_alive = headers.get("connection", "").lower() != "close"
    return RawResponse(status, headers, content), keep_alive


def _dumps(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode()


def httpx_client(max_connections: int, timeout_s: float) -> httpx.AsyncClient:
    """httpx with a pool that holds ``max_connections`` (kept alive), one timeout."""
    return httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        ),
        timeout=httpx.Timeout(timeout_s),
        trust_env=False,  # never route loopback load through a proxy from the environment
    )
