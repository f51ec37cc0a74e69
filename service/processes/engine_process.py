"""``python -m service.processes.engine_process``: one engine core, one replica of one model.

It builds the model's engine core as the one-process service does (service/engine_core/core.py:
warm-up, calibration, the batcher and its queue) and serves it on its socket until SIGTERM,
which drains: new rows are refused, the rows in flight finish within ``MT_SHUTDOWN_GRACE_S``. The settings
come from the same ``MT_*`` environment as the front-ends'; the supervisor gives the model, the
socket address, the intra-op threads and this replica's share of the CPUs of the plan.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from service.config import Settings, get_settings
from service.cpus import cpu_budget
from service.engine_core.core import build_engine_core
from service.engine_core.server import EngineCoreServer
from service.metrics import ServiceMetrics
from service.processes.children import die_with_parent
from service.runtime.engine import open_engine
from service.web.request_log import configure_logging

logger = logging.getLogger(__name__)


def load_server(
    settings: Settings, model_id: str, model_dir: Path, address: str, cpus: int
) -> EngineCoreServer:
    """The model's engine core (service/engine_core/core.py, as the one-process service
    builds it) behind a server that is not serving yet; ``cpus``: this replica's share."""
    core = build_engine_core(
        model_id,
        open_engine(model_dir, settings.model),
        settings.scheduling,
        ServiceMetrics().for_model(model_id),
        max_chars_per_text=settings.limits.max_chars_per_text,
        cpus=cpus,
    )
    return EngineCoreServer(core.batcher, core.info, address)


async def serve(server: EngineCoreServer, grace_s: float) -> bool:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop)
    return await server.serve(grace_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.processes.engine_process")
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--address", required=True, help="the ZeroMQ address to bind (ipc://...)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: settings)")
    parser.add_argument(
        "--cpus", type=int, default=0, help="this replica's share of the CPUs (0: the budget's)"
    )
    args = parser.parse_args(argv)
    die_with_parent()
    settings = get_settings()
    if args.threads:
        settings = settings.replace(intra_op_threads=args.threads)
    process = settings.process  # logs as the front-ends and the single process write them
    configure_logging(
        process.log_level, process.log_format, f"engine core {args.model_id} %(process)d"
    )
    cpus = args.cpus or cpu_budget().cpus
    server = load_server(settings, args.model_id, args.model_dir, args.address, cpus)
    drained = asyncio.run(serve(server, settings.process.shutdown_grace_s))
    return 0 if drained else 1


if __name__ == "__main__":
    sys.exit(main())
