"""``python -m service.processes.engine_process``: one engine core, one replica of one model.

It loads the model's engine as the one-process service does (warm-up, calibration), puts a
``ContinuousBatcher`` in front of it and serves it on its socket until SIGTERM, which drains:
new rows are refused, the rows in flight finish within ``MT_SHUTDOWN_GRACE_S``. The settings
come from the same ``MT_*`` environment as the front-ends'; the supervisor gives the model, the
socket address and the intra-op threads of the plan.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from service.config import Settings, get_settings
from service.engine_core.protocol import EngineCoreInfo
from service.engine_core.server import EngineCoreServer
from service.metrics import ServiceMetrics
from service.processes.supervisor import die_with_parent
from service.runtime.engine import open_engine
from service.scheduling.batcher import ContinuousBatcher
from service.wiring import spare_core

logger = logging.getLogger(__name__)


def load_server(
    settings: Settings, model_id: str, model_dir: Path, address: str
) -> EngineCoreServer:
    """The model's engine, warmed up (and calibrated where admission is cost-aware), behind
    a batcher and a server that is not serving yet."""
    engine = open_engine(model_dir, settings.model)
    engine.warmup()
    batching = settings.scheduling
    if batching.admission_cost_aware and batching.batching == "continuous":
        engine.calibrate()
    metrics = ServiceMetrics().for_model(model_id)
    batcher = ContinuousBatcher(engine, batching, metrics=metrics, spare_core=spare_core())
    info = EngineCoreInfo(
        model_id, engine.provider, engine.model.info.max_positions, batcher.max_queue
    )
    return EngineCoreServer(batcher, info, address)


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
    args = parser.parse_args(argv)
    die_with_parent()
    settings = get_settings()
    if args.threads:
        settings = settings.replace(intra_op_threads=args.threads)
    logging.basicConfig(
        level=settings.process.log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s [engine core {args.model_id} "
        "%(process)d]: %(message)s",
    )
    server = load_server(settings, args.model_id, args.model_dir, args.address)
    drained = asyncio.run(serve(server, settings.process.shutdown_grace_s))
    return 0 if drained else 1


if __name__ == "__main__":
    sys.exit(main())
