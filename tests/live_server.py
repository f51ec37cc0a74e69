"""The real app on a real socket (uvicorn in a thread), for clients that speak HTTP themselves:
``libretranslatepy`` (urllib), streaming clients that hang up, and the browser."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from service.config import Settings
from service.wiring import create_app
from tests.ready import wait_ready


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def live_server(
    settings: Settings | None = None, app: FastAPI | None = None, http: str = "auto"
) -> Iterator[str]:
    """Serve ``app`` (else ``create_app(settings)``) on 127.0.0.1 behind uvicorn's ``http``
    implementation until the block ends; yields the base URL (with a trailing slash) once
    ``/ready`` says 200."""
    app = app if app is not None else create_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            http=http,
            log_level="warning",
            lifespan="on",
            proxy_headers=False,  # as the service runs it (service.web.server.uvicorn_config)
        )
    )
    thread = threading.Thread(target=server.run, name="live-server", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_ready(base)
        yield base
    finally:
        server.should_exit = True
        thread.join(30)
