"""One server start for the one-process service (``python -m service``) and every HTTP
front-end of the multi-process one (service/processes/frontend.py): logging (text or
``MT_LOG_FORMAT=json``, the request id on every line, uvicorn's access log), uvicorn's
configuration from the settings, and the graceful shutdown on SIGTERM.

Both process modes start here, so a setting of the process group means the same in each: a
JSON log is JSON whichever process writes it, and a front-end drains as the single process
does.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from service.config import Settings
from service.web.request_id import install_request_id_logging
from service.web.request_log import configure_logging, use_json_format


class GracefulServer(uvicorn.Server):
    """uvicorn, but the app hears about SIGTERM first: uvicorn alone keeps admitting requests
    on open keep-alive connections while it waits for the in-flight ones to finish."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()  # sets flags only: safe inside a signal handler
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, less the re-raise: after a graceful shutdown uvicorn raises the captured
        SIGTERM or SIGINT again, so the process dies of it (143 or 130 to ``make`` and to
        shells). The stop was asked for and the drain is done: the process exits 0."""
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def uvicorn_config(app: ASGIApp, settings: Settings) -> uvicorn.Config:
    """uvicorn's configuration from the service's settings."""
    return uvicorn.Config(
        app,
        host=settings.process.host,
        port=settings.process.port,
        log_level=settings.process.log_level.lower(),
        # JSON logs have a record per request of their own (service/web/request_log.py).
        access_log=settings.process.access_log and settings.process.log_format == "text",
        lifespan="on",
        # The client behind a proxy is the app's to find (service/web/forwarded.py,
        # MT_TRUSTED_PROXIES): uvicorn's own handling would apply a second, other rule.
        proxy_headers=False,
        timeout_graceful_shutdown=max(1, round(settings.process.shutdown_grace_s)),
    )


def start_logging(settings: Settings, role: str = "") -> None:
    """The process's logging, before the app is assembled (it logs meanwhile): text lines
    (``role``, such as ``front-end 4711``, names the process in each) or JSON objects, each
    with the request id of the request it was written for."""
    configure_logging(settings.process.log_level, settings.process.log_format, role)
    install_request_id_logging()


def serve(app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then drain (``MT_SHUTDOWN_GRACE_S``); on
    ``sockets`` where given (a front-end's inherited listener), else on the settings' host
    and port."""
    config = uvicorn_config(app, settings)
    # uvicorn.Config has just configured its loggers: the id and the format once more
    install_request_id_logging()
    if settings.process.log_format == "json":
        use_json_format()
    # A process of its own: its long-lived heap leaves the collector once ready.
    app.state.service.freeze_heap = True
    server = GracefulServer(config, on_exit=app.state.service.begin_shutdown)
    server.run(sockets=sockets)
