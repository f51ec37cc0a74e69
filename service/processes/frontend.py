"""``python -m service.processes.frontend``: one HTTP front-end of the multi-process service.

The app is the one-process service's (``create_app``), with each model's batcher replaced by a
client of the model's engine cores (the supervisor's plan names their sockets; the front-end
follows the plan as the supervisor replaces it, service/translation/plan_follower.py). Every
front-end accepts on the one listening socket the supervisor opened and handed down, so they
share the port, and a front-end that dies leaves the socket to the others. SIGTERM drains as
``python -m service`` does.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path

from service.__main__ import GracefulServer, uvicorn_config
from service.config import get_settings
from service.engine_core.plan import PublishedPlan
from service.processes.children import die_with_parent
from service.web.request_id import install_request_id_logging
from service.wiring import create_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.processes.frontend")
    parser.add_argument("--fd", type=int, required=True, help="the inherited listening socket")
    parser.add_argument("--plan", type=Path, required=True, help="the supervisor's plan (JSON)")
    args = parser.parse_args(argv)
    die_with_parent()
    settings = get_settings()
    logging.basicConfig(
        level=settings.process.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [front-end %(process)d %(request_id)s]: "
        "%(message)s",
    )
    install_request_id_logging()  # the app logs while it is assembled
    app = create_app(settings, engine_cores=PublishedPlan.load(args.plan))
    config = uvicorn_config(app, settings)
    install_request_id_logging()  # after uvicorn.Config, which configures its loggers
    server = GracefulServer(config, on_exit=app.state.service.begin_shutdown)
    server.run(sockets=[socket.socket(fileno=args.fd)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
