"""``python -m service [--host HOST] [--port PORT] [--model-dir DIR]``: serve the app with uvicorn.

``python -m service models ...`` manages the installed models instead (service/models_cli);
``MT_MODELS`` names models to pull before serving, when they are not installed.

Settings come from ``MT_*`` environment variables (service/config.py); the flags override
the matching ones. On SIGTERM (or Ctrl-C) new translation requests get 503 at once, requests
in flight finish for up to ``MT_SHUTDOWN_GRACE_S`` seconds, then the process exits with
status 0.

``MT_PROCESS_MODE=multi`` (the default) hands the work to the supervisor
(service/processes/supervisor.py): HTTP front-ends and engine-core processes behind the one
port. ``single`` serves everything from this process.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from service.config import Settings, get_settings
from service.web.request_id import install_request_id_logging
from service.web.request_log import configure_logging, use_json_format
from service.wiring import create_app

logger = logging.getLogger(__name__)


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
        timeout_graceful_shutdown=max(1, round(settings.process.shutdown_grace_s)),
    )


def models_at_startup(settings: Settings) -> Settings | None:
    """The settings after ``MT_MODELS``' pulls (service/models_cli/startup.py); None when a
    pull failed, after a log line that says why (the process then exits with status 1)."""
    from service.models_cli.startup import startup_settings

    try:
        return startup_settings(settings)
    except Exception as error:  # a sentence in the log; MT_LOG_LEVEL=debug adds where
        logger.debug("MT_MODELS: the pull failed", exc_info=True)
        logger.error("MT_MODELS: %s; not starting", error)
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["models"]:  # python -m service models pull|list|update|remove
        from service.models_cli import main as models_main

        return models_main(argv[1:])
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--host", default=settings.process.host, help="MT_HOST (default %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=settings.process.port, help="MT_PORT (default %(default)s)"
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="serve this one export (overrides MT_EXPORTS and MT_MODELS_DIR)",
    )
    parser.add_argument("--log-level", default=settings.process.log_level, help="MT_LOG_LEVEL")
    args = parser.parse_args(argv)
    update = {"host": args.host, "port": args.port, "log_level": args.log_level}
    if args.model_dir is not None:
        update |= {"exports": [args.model_dir], "models_dir": None}
    settings = settings.replace(**update)
    configure_logging(settings.process.log_level, settings.process.log_format)
    install_request_id_logging()  # the app logs while it is assembled
    if args.model_dir is None:  # MT_MODELS' pulls, before any model loads
        ready = models_at_startup(settings)
        if ready is None:
            return 1
        settings = ready
    if settings.process.process_mode != "single":  # front-ends and engine cores
        from service.processes.supervisor import build_supervisor

        supervisor = build_supervisor(settings)
        if supervisor is not None:
            return supervisor.run()
    app = create_app(settings)
    config = uvicorn_config(app, settings)
    install_request_id_logging()  # after uvicorn.Config, which configures its loggers
    if settings.process.log_format == "json":
        use_json_format()
    server = GracefulServer(config, on_exit=app.state.service.begin_shutdown)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
