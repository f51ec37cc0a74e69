"""The multi-process service in tests: a small one started as a subprocess, and its live child
processes read from /proc (the tests find its front-ends and engine cores this way)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]


def multiprocess_env(**settings: str) -> dict[str, str]:
    """This process's environment without its MT_* settings, for a small multi-process
    service: two front-ends, one engine core of one thread on the CPU, no detection, no
    access log, a short drain; ``settings`` add or override."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MT_")}
    env.update(
        MT_PROCESS_MODE="multi",
        MT_FRONTENDS="2",
        MT_ENGINE_REPLICAS="1",
        MT_INTRA_OP_THREADS="1",
        MT_PROVIDER="cpu",
        MT_LANGUAGE_DETECTION="false",
        MT_ACCESS_LOG="false",
        MT_LOG_LEVEL="warning",
        MT_SHUTDOWN_GRACE_S="3",
    )
    env.update(settings)
    return env


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
