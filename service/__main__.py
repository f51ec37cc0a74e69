"""``python -m service [serve] [--host HOST] [--port PORT] [--model-dir DIR]``: serve the app.

``python -m service models ...`` manages the installed models instead (service/models_cli),
``python -m service translate ...`` translates text and files without a server
(service/batch); ``--help`` lists the verbs (service/verbs.py). ``MT_MODELS`` names models
to pull before serving, when they are not installed.

Settings come from ``MT_*`` environment variables (service/config.py); the flags override
the matching ones. On SIGTERM (or Ctrl-C) new translation requests get 503 at once, requests
in flight finish for up to ``MT_SHUTDOWN_GRACE_S`` seconds, then the process exits with
status 0.

``MT_PROCESS_MODE=auto`` (the default) hands the work to the supervisor
(service/processes/supervisor.py) with a GPU or from four CPUs: HTTP front-ends and
engine-core processes behind the one port; ``multi`` always does, ``single`` never: everything
is served from this process. Both modes start their HTTP servers one way
(service/web/server.py) and build their engine cores one way (service/engine_core/core.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from service.config import Settings, get_settings
from service.verbs import DESCRIPTION, USAGE, epilog, run_verb, serve_argv
from service.web.server import serve, start_logging

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    """The app of one process (service/wiring.py), imported only here: a supervisor (multi-
    process mode) never builds it, and does not hold the engine's and the app's imports."""
    from service.wiring import create_app as build

    return build(settings)


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
    if (status := run_verb(argv)) is not None:  # models, translate (service/verbs.py)
        return status
    argv = serve_argv(argv)
    settings = get_settings()
    parser = argparse.ArgumentParser(
        prog="python -m service",
        usage=USAGE,
        description=DESCRIPTION,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    start_logging(settings)
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
    serve(create_app(settings), settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
