"""The service in tests, in either process mode, and the one wait-for-ready helper.

``serving(mode, settings)`` serves the real app from the settings and yields once ``/ready``
says 200:

* ``single``: the app in this process behind Starlette's ``TestClient`` (fast, and the app's
  internals are there to read: ``Served.app``);
* ``multi``: ``python -m service`` with ``MT_PROCESS_MODE=multi`` as a child process (a
  supervisor, a front-end and an engine core of one thread), reached over HTTP on a free port.

``Served.client`` is an ``httpx.Client`` either way, so a test written against one runs against
both: a module's client fixture takes the ``process_mode`` fixture (tests/conftest.py), which
runs its tests in each mode, one server per mode and module. ``wait_ready`` (tests/ready.py)
is the one wait for ``/ready``.

``serving_engine(mode, settings, engine)`` serves a given engine (one a test holds steps of, or
injects a fault into) in either mode, inside this process: ``single`` as the one-process
service builds it; ``multi`` as an engine-core process and a front-end build theirs (the real
engine-core server on a socket, in a thread of its own, and the front-end's app pointed at it
by a plan), so the protocol, the client and the server are the real ones and only the engine
is the test's.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from service.config import Settings
from service.scheduling.batcher import ContinuousBatcher
from tests.live_server import free_port, live_server
from tests.process_tree import multi_env, start_service, stop_service
from tests.ready import wait_ready, wait_ready_async

MODES = ("single", "multi")


@dataclass
class Served:
    mode: str
    client: httpx.Client
    base: str  # the base URL, with a trailing slash ("http://testserver/" in one process)
    app: FastAPI | None = None  # single: the app itself
    process: subprocess.Popen[bytes] | None = None  # multi: the supervisor
    log_path: Path | None = None  # multi: every process's output

    def log(self) -> str:
        return "" if self.log_path is None else self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def serving(mode: str, workdir: Path, *, http: bool = False, **settings: Any) -> Iterator[Served]:
    """The service of ``Settings(**settings)`` in ``mode`` until the block ends, ready.
    ``workdir``: where a multi-process service writes its log (and its data, unless
    ``data_dir`` is among the settings). ``http``: in one process too, a real socket (uvicorn
    in a thread, tests/live_server.py), for clients that open their own connections."""
    settings.setdefault("data_dir", workdir / "data")
    if mode == "multi":
        with child_service(workdir, **settings) as served:
            yield served
        return
    from fastapi.testclient import TestClient

    from service.config import Settings
    from service.wiring import create_app

    app = create_app(Settings(**({"provider": "cpu", "intra_op_threads": 1} | settings)))
    if http:
        with live_server(app=app) as base, httpx.Client(base_url=base, timeout=60) as client:
            yield Served(mode, client, base, app=app)
        return
    with TestClient(app) as test_client:
        wait_ready(test_client)
        yield Served(mode, test_client, "http://testserver/", app=app)


@contextlib.contextmanager
def child_service(workdir: Path, **settings: Any) -> Iterator[Served]:
    """``python -m service`` as a child process (``multi_env``: multi-process unless
    ``process_mode`` says otherwise), its output in ``workdir``/service.log, until the block
    ends (then SIGTERM: the drain)."""
    settings.setdefault("data_dir", workdir / "data")
    port = free_port()
    log_path = workdir / "service.log"
    with log_path.open("wb") as log:
        process = start_service(port, multi_env(**settings), log)
    base = f"http://127.0.0.1:{port}/"
    mode = settings.get("process_mode", "multi")
    served = Served(mode, httpx.Client(base_url=base, timeout=60, trust_env=False), base)
    served.process, served.log_path = process, log_path
    try:
        wait_ready(served.client, process=process, log=served.log)
        yield served
    finally:
        served.client.close()
        stop_service(process)


@dataclass
class EngineServed:
    """A service of a given engine, in one process or split (``serving_engine``)."""

    mode: str
    app: FastAPI  # the one process's app, or the front-end's
    client: httpx.AsyncClient  # on ``app``
    batcher: ContinuousBatcher  # the engine's: in the app (single) or the engine core (multi)
    core: EngineCoreThread | None = None  # multi: the engine core


@contextlib.asynccontextmanager
async def serving_engine(mode: str, settings: Settings, engine: Any) -> AsyncIterator[EngineServed]:
    """``engine`` (the only model's, found from ``settings``) served in ``mode`` with the
    app's lifespan running and an httpx client on the app, once ``/ready`` says 200."""
    from service.wiring import create_app

    if mode == "single":
        app = create_app(settings, engine=engine)
        async with asgi_client(app) as client:
            [slot] = app.state.service.registry.slots.values()
            yield EngineServed(mode, app, client, slot.model.batcher)
        return
    from service.cpus import cpu_budget
    from service.engine_core.plan import ProcessPlan

    core = EngineCoreThread(settings, engine)
    try:
        core.start()
        threads = settings.model.engine_threads
        plan = ProcessPlan(1, 1, threads, cpu_budget().cpus, {core.model_id: [core.address]})
        app = create_app(settings, engine_cores=plan)
        async with asgi_client(app) as client:
            yield EngineServed(mode, app, client, core.batcher, core)
    finally:
        core.stop()


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, an httpx client on it, once /ready says so."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mt") as client:
            await wait_ready_async(client)
            yield client


class EngineCoreThread:
    """An engine core as ``python -m service.processes.engine_process`` builds it
    (``load_server``'s parts, around a given engine), serving on a TCP socket of 127.0.0.1 from
    its own event loop in a thread, as it does from its own process."""

    def __init__(self, settings: Settings, engine: Any) -> None:
        from service.cpus import cpu_budget
        from service.engine_core.core import build_engine_core
        from service.engine_core.server import EngineCoreServer
        from service.metrics import ServiceMetrics
        from service.translation.discovery import discover_models

        model = settings.model
        [spec] = discover_models(
            model.exports, model.models_dir, model.served_model_name, model.load_only
        )
        self.model_id = spec.model_id
        self.address = f"tcp://127.0.0.1:{free_port()}"
        core = build_engine_core(
            spec.model_id,
            engine,
            settings.scheduling,
            ServiceMetrics().for_model(spec.model_id),
            max_chars_per_text=settings.limits.max_chars_per_text,
            cpus=cpu_budget().cpus,
        )
        self.batcher = core.batcher
        self.server = EngineCoreServer(core.batcher, core.info, self.address)
        self._grace_s = settings.process.shutdown_grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="engine-core", daemon=True)
        self.drained: bool | None = None  # what ``serve`` returned, once it has

    def _run(self) -> None:
        async def serve() -> bool:
            self._loop = asyncio.get_running_loop()
            return await self.server.serve(self._grace_s)

        self.drained = asyncio.run(serve())

    def start(self) -> None:
        self._thread.start()

    @property
    def serving(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM's drain (``server.stop`` on its loop), waited for."""
        if self._loop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop has just ended by itself
                self._loop.call_soon_threadsafe(self.server.stop)
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
            assert not self._thread.is_alive(), "the engine core did not stop"
