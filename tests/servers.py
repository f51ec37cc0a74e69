"""The service in tests, in either process mode, and the one wait-for-ready helper.

``serving(mode, settings)`` serves the real app from the settings and yields once ``/ready``
says 200:

* ``single``: the app in this process behind Starlette's ``TestClient`` (fast, and the app's
  internals are there to read: ``Served.app``);
* ``multi``: ``python -m service`` with ``MT_PROCESS_MODE=multi`` as a child process (a
  supervisor, a front-end and an engine core of one thread), reached over HTTP on a free port.

``Served.client`` is an ``httpx.Client`` either way, so a test written against one runs against
both: a module's client fixture takes the ``process_mode`` fixture (tests/conftest.py), which
runs its tests in each mode, one server per mode and module.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from tests.live_server import free_port
from tests.process_tree import start_service, stop_service

MODES = ("single", "multi")
READY_TIMEOUT_S = 180.0


def wait_ready(
    client: httpx.Client | str,
    timeout_s: float = READY_TIMEOUT_S,
    *,
    until: Callable[[httpx.Response], bool] = lambda response: response.status_code == 200,
    process: subprocess.Popen[bytes] | None = None,
    log: Callable[[], str] = lambda: "",
) -> httpx.Response:
    """``/ready``'s first answer that ``until`` accepts (by default a 200), asked every 20 ms:
    ``client`` is a client of the app (a ``TestClient`` too) or a server's base URL. A server
    that does not answer yet is asked again; ``process``, where given, must stay alive. Fails
    with the last answer (and ``log()``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{log()}")
        with contextlib.suppress(httpx.TransportError):
            if isinstance(client, str):
                response = httpx.get(f"{client.rstrip('/')}/ready", timeout=5, trust_env=False)
            else:
                response = client.get("/ready")
            if until(response):
                return response
            last = f"{response.status_code} {response.text}"
        if time.monotonic() > deadline:
            raise AssertionError(f"/ready never answered as expected: {last}\n{log()}")
        time.sleep(0.02)


def settings_env(**settings: Any) -> dict[str, str]:
    """``Settings(**settings)`` as the ``MT_*`` variables of a child process."""

    def text(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return ",".join(str(item) for item in value)
        return str(value)

    return {f"MT_{name.upper()}": text(value) for name, value in settings.items()}


def multi_env(**settings: Any) -> dict[str, str]:
    """The environment of a small multi-process service: this one without its ``MT_*``
    settings, one front-end and one engine core of one thread on the CPU, no access log, a
    short drain; ``settings`` (flat field names, as ``Settings`` takes them) add or override."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MT_")}
    env |= settings_env(
        process_mode="multi",
        frontends=1,
        engine_replicas=1,
        intra_op_threads=1,
        provider="cpu",
        language_detection=False,
        access_log=False,
        log_level="warning",
        shutdown_grace_s=3,
    )
    return env | settings_env(**settings)


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
def serving(mode: str, workdir: Path, **settings: Any) -> Iterator[Served]:
    """The service of ``Settings(**settings)`` in ``mode`` until the block ends, ready.
    ``workdir``: where a multi-process service writes its log (and its data, unless
    ``data_dir`` is among the settings)."""
    settings.setdefault("data_dir", workdir / "data")
    if mode == "single":
        from fastapi.testclient import TestClient

        from service.config import Settings
        from service.wiring import create_app

        settings = {"provider": "cpu", "intra_op_threads": 1} | settings
        app = create_app(Settings(**settings))
        with TestClient(app) as client:
            wait_ready(client)
            yield Served(mode, client, "http://testserver/", app=app)
        return
    with child_service(workdir, **settings) as served:
        yield served


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
