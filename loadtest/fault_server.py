"""``python -m loadtest.fault_server --port PORT``: the service with faults on signal, for
``python -m loadtest faults``. Never part of the service itself.

The real engine (``MT_EXPORTS``) is wrapped so that:

* ``SIGUSR1``: the next decoder step raises ``RuntimeError`` (an engine error in one step);
* ``SIGUSR2``: the next decoder step raises a ``BaseException`` that the batcher does not
  catch, so the engine thread dies (as a bug in its loop would).

Everything else is ``python -m service``: settings from the environment, SIGTERM drains.
"""

from __future__ import annotations

import argparse
import signal
from types import FrameType

import uvicorn

from service.config import get_settings
from service.runtime.engine import Engine
from service.runtime.types import FinishedRequest
from service.web.server import GracefulServer
from service.wiring import create_app


class InjectedThreadDeath(BaseException):
    pass


class FaultOnSignalEngine:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.pending: BaseException | None = None

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def step(self) -> list[FinishedRequest]:
        fault, self.pending = self.pending, None
        if fault is not None:
            raise fault
        return self._engine.step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.fault_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    settings = get_settings()
    engine = FaultOnSignalEngine(
        Engine.from_dir(
            settings.model.model_dir,
            provider=settings.model.provider,
            intra_op_threads=settings.model.intra_op_threads,
        )
    )

    def step_error(_: int, __: FrameType | None) -> None:
        engine.pending = RuntimeError("injected engine error (loadtest fault_server)")

    def thread_death(_: int, __: FrameType | None) -> None:
        engine.pending = InjectedThreadDeath()

    signal.signal(signal.SIGUSR1, step_error)
    signal.signal(signal.SIGUSR2, thread_death)
    app = create_app(settings, engine=engine)  # type: ignore[arg-type]
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        lifespan="on",
        timeout_graceful_shutdown=max(1, round(settings.process.shutdown_grace_s)),
    )
    GracefulServer(config, on_exit=app.state.service.begin_shutdown).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
