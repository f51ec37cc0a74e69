"""The multi-process service in tests: a small one started as a subprocess, and its live child
processes read from /proc (the tests find its front-ends and engine cores this way)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]


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
    short drain, the rest as ``Settings()`` has it; ``settings`` (flat field names, as
    ``Settings`` takes them) add or override."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MT_")}
    env |= settings_env(
        process_mode="multi",
        frontends=1,
        engine_replicas=1,
        intra_op_threads=1,
        provider="cpu",
        access_log=False,
        log_level="warning",
        shutdown_grace_s=1,
    )
    return env | settings_env(**settings)


def multiprocess_env(**settings: str) -> dict[str, str]:
    """``multi_env`` with two front-ends and no language detection; ``settings`` are
    ``MT_*`` variables that add or override."""
    return multi_env(frontends=2, language_detection=False, shutdown_grace_s=3) | settings


def start_service(port: int, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen:
    """``python -m service`` on 127.0.0.1:``port`` from this checkout, its output in ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop_service(process: subprocess.Popen, wait_s: float = 30.0) -> None:
    """SIGTERM (the drain), then SIGKILL if it has not exited within ``wait_s``."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def children(pid: int) -> dict[int, str]:
    """The live child processes of ``pid``: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(entry.name)] = command
    return found
