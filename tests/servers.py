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
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from tests.live_server import free_port, live_server
from tests.process_tree import multi_env, start_service, stop_service
from tests.ready import wait_ready

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
