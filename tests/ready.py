"""The one wait for a server's ``/ready``: every test that starts a service waits here."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable

import httpx

READY_TIMEOUT_S = 180.0


def wait_ready(
    client: httpx.Client | str,
    timeout_s: float = READY_TIMEOUT_S,
    *,
    until: Callable[[httpx.Response], bool] = lambda response: response.status_code == 200,
    process: subprocess.Popen[bytes] | None = None,
    log: Callable[[], str] = lambda: "",
) -> httpx.Response:
    """``/ready``'s first answer that ``until`` accepts (by default a 200), asked every 20 ms:
    ``client`` is a client of the app (a ``TestClient`` too) or a server's base URL. A server
    that does not answer yet is asked again; ``process``, where given, must stay alive. Fails
    with the last answer (and ``log()``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{log()}")
        with contextlib.suppress(httpx.TransportError):
            if isinstance(client, str):
                response = httpx.get(f"{client.rstrip('/')}/ready", timeout=5, trust_env=False)
            else:
                response = client.get("/ready")
            if until(response):
                return response
            last = f"{response.status_code} {response.text}"
        if time.monotonic() > deadline:
            raise AssertionError(f"/ready never answered as expected: {last}\n{log()}")
        time.sleep(0.02)


async def wait_ready_async(
    client: httpx.AsyncClient,
    timeout_s: float = READY_TIMEOUT_S,
    *,
    until: Callable[[httpx.Response], bool] = lambda response: response.status_code == 200,
) -> httpx.Response:
    """``wait_ready`` for an app served on this event loop (``httpx.ASGITransport``)."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not until(response := await client.get("/ready")):
        if time.monotonic() > deadline:
            raise AssertionError(f"/ready never answered as expected: {response.text}")
        await asyncio.sleep(0.01)
    return response
