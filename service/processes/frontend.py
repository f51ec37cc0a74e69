"""``python -m service.processes.frontend``: one HTTP front-end of the multi-process service.

The app is the one-process service's (``create_app``), with each model's batcher replaced by a
client of the model's engine cores (the supervisor's plan, on the command line, names their
sockets; the front-end follows each move the old engine cores tell it of,
service/translation/plan_follower.py). Every
front-end accepts on the one listening socket the supervisor opened and handed down, so they
share the port, and a front-end that dies leaves the socket to the others. SIGTERM drains as
``python -m service`` does: both start their servers in service/web/server.py (logging, the
access log, the drain).
"""

from __future__ import annotations

import argparse
import socket
import sys

from service.config import get_settings
from service.engine_core.plan import ProcessPlan
from service.processes.children import die_with_parent
from service.web.server import serve, start_logging
from service.wiring import create_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.processes.frontend")
    parser.add_argument("--fd", type=int, required=True, help="the inherited listening socket")
    parser.add_argument("--plan", required=True, help="the supervisor's plan now (JSON)")
    args = parser.parse_args(argv)
    die_with_parent()
    settings = get_settings()
    start_logging(settings, role="front-end %(process)d")
    app = create_app(settings, engine_cores=ProcessPlan.from_json(args.plan))
    serve(app, settings, sockets=[socket.socket(fileno=args.fd)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
