"""The serving runtime installs and serves on its own: no torch, no onnx, one ONNX Runtime.

A fresh venv gets exactly what the CPU image installs (Dockerfile, cpu stage): the pins of
docker/requirements-runtime.txt, ``onnxruntime==ORT_VERSION``, and the project with
``--no-deps``. A tiny model is exported with this (the test) environment's torch tooling, and
``python -m service`` from the fresh venv must serve a translation from it and exit cleanly on
SIGTERM. Needs PyPI (or a pip cache / configured mirror); skipped only when the network is
unreachable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.service_fixtures import tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_REQUIREMENTS = ROOT / "docker" / "requirements-runtime.txt"
CONSTRAINTS = ROOT / "constraints.txt"
# What `pip install --no-deps .` needs from the source tree (pyproject: readme, packages).
PROJECT_FILES = ("pyproject.toml", "README.md", "models", "export", "service")
INSTALL_TIMEOUT_S = 600
READY_TIMEOUT_S = 120
SHUTDOWN_GRACE_S = 5
# pip's messages when it cannot reach the index (urllib3/requests/socket errors).
NETWORK_ERROR = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|Connection refused|"
    r"ConnectTimeoutError|ReadTimeoutError|Max retries exceeded|ProxyError|"
    r"No route to host|connection broken|NameResolutionError|Failed to resolve",
    re.IGNORECASE,
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _ort_version() -> str:
    """The ONNX Runtime version the images install (Dockerfile ``ARG ORT_VERSION``)."""
    match = re.search(r"^ARG ORT_VERSION=(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert match, "Dockerfile has no ARG ORT_VERSION"
    return match.group(1)


def _pins() -> dict[str, str]:
    pins = {}
    for line in RUNTIME_REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_canonical(name)] = version
    return pins


def _clean_env(**extra: str) -> dict[str, str]:
    """The test process's Python/venv/MT_* settings must not reach the fresh venv."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
        and not key.startswith("MT_")
    }
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


def _pip(python: Path, *args: str, cwd: Path) -> None:
    """Run pip in the fresh venv; skip on a network failure, fail on anything else."""
    # Few retries and a short socket timeout: offline, pip gives up in seconds (DNS) or at
    # worst by INSTALL_TIMEOUT_S (black-holed), instead of 5 retries x PIP_DEFAULT_TIMEOUT.
    command = [str(python), "-m", "pip", "install", "--quiet", "--no-compile"]
    command += ["--retries", "2", "--timeout", "30", *args]
    try:
        result = subprocess.run(
            command,
            cwd=cwd,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as error:
        output = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part or ""
            for part in (error.stdout, error.stderr)
        )
        if NETWORK_ERROR.search(output):
            pytest.skip(f"PyPI unreachable (pip timed out on the network):\n{output[-2000:]}")
        raise
    if result.returncode != 0:
        output = result.stdout + result.stderr
        if NETWORK_ERROR.search(output):
            pytest.skip(f"PyPI unreachable, cannot build the runtime venv:\n{output[-2000:]}")
        pytest.fail(f"{' '.join(command)} failed ({result.returncode}):\n{output[-4000:]}")


@pytest.fixture(scope="module")
def runtime_python(tmp_path_factory) -> Path:
    """The python of a fresh venv holding only the runtime set, as in the CPU image."""
    root = tmp_path_factory.mktemp("runtime_venv")
    # Build the project from a copy, so the install neither writes into the checkout's
    # build/ nor lets the venv import the checkout instead of site-packages.
    source = root / "src"
    source.mkdir()
    for name in PROJECT_FILES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)

    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], check=True, env=_clean_env(), timeout=300
    )
    python = venv / "bin" / "python"
    _pip(
        python,
        "-c",
        str(CONSTRAINTS),
        "-r",
        str(RUNTIME_REQUIREMENTS),
        f"onnxruntime=={_ort_version()}",
        cwd=root,
    )
    _pip(python, "--no-deps", "-c", str(CONSTRAINTS), str(source), cwd=root)
    return python


def _run_python(python: Path, code: str) -> subprocess.CompletedProcess:
    """Run code in the venv from outside the checkout (so ``service`` is the installed one)."""
    return subprocess.run(
        [str(python), "-c", code],
        cwd=python.parent,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("module", ["torch", "onnx"])
def test_runtime_venv_has_no_export_packages(runtime_python, module):
    result = _run_python(runtime_python, f"import {module}")
    assert result.returncode != 0, f"{module} is importable in the runtime venv"
    assert "ModuleNotFoundError" in result.stderr, result.stderr


def test_runtime_venv_holds_exactly_the_pinned_set_and_one_onnxruntime(runtime_python):
    result = _run_python(
        runtime_python,
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))",
    )
    assert result.returncode == 0, result.stderr
    installed = {_canonical(name): version for name, version in json.loads(result.stdout).items()}

    runtimes = {name for name in installed if name in ("onnxruntime", "onnxruntime-gpu")}
    assert runtimes == {"onnxruntime"}, f"ONNX Runtime distributions: {sorted(runtimes)}"
    assert installed["onnxruntime"] == _ort_version()

    # Everything the install pulled in is pinned, at its pin: the requirements file is the
    # full closure, so the images resolve nothing unpinned.
    pins = _pins()
    allowed = set(pins) | {"pip", "setuptools", "wheel", "mtserve", "onnxruntime"}
    unpinned = {name: v for name, v in installed.items() if name not in allowed}
    assert not unpinned, f"installed but not pinned in requirements-runtime.txt: {unpinned}"
    drift = {
        name: (installed.get(name), pin) for name, pin in pins.items() if installed.get(name) != pin
    }
    assert not drift, f"installed vs pinned: {drift}"

    check = subprocess.run(
        [str(runtime_python), "-m", "pip", "check"],
        cwd=runtime_python.parent,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_service_imports_without_torch(runtime_python):
    result = _run_python(
        runtime_python,
        "import sys, service.web.app, service.runtime.engine, service.__main__; "
        "assert 'torch' not in sys.modules, 'service.web.app pulled in torch'; "
        "assert 'onnx' not in sys.modules, 'service.web.app pulled in onnx'; "
        "print(service.web.app.__file__)",
    )
    assert result.returncode == 0, result.stderr
    # The installed package, not the checkout.
    assert Path(result.stdout.strip()).is_relative_to(runtime_python.parents[1]), result.stdout


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny model, exported with this environment's torch (shared with other modules)."""
    return tiny_model(tmp_path_factory)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_runtime_venv_serves_a_translation_and_stops_on_sigterm(
    runtime_python, model_dir, tmp_path
):
    port = _free_port()
    log_path = tmp_path / "server.log"
    env = _clean_env(
        MT_EXPORTS=str(model_dir),
        MT_PROVIDER="cpu",
        MT_INTRA_OP_THREADS="1",
        MT_SHUTDOWN_GRACE_S=str(SHUTDOWN_GRACE_S),
    )
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [str(runtime_python), "-m", "service", "--host", "127.0.0.1", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def server_log() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(base_url=base, timeout=10) as client:
            while True:
                assert server.poll() is None, (
                    f"server exited with {server.returncode} before ready:\n{server_log()}"
                )
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, (
                    f"/ready not 200 after {READY_TIMEOUT_S} s:\n{server_log()}"
                )
                time.sleep(0.5)

            response = client.post("/v1/translate", json={"text": "Save the file."}, timeout=60)
            assert response.status_code == 200, f"{response.text}\n{server_log()}"
            text = response.json()["translations"][0]["text"]
            assert isinstance(text, str) and text.strip(), response.text

        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=SHUTDOWN_GRACE_S + 15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {SHUTDOWN_GRACE_S + 15} s of SIGTERM:\n{server_log()}")
        # uvicorn re-raises the captured SIGTERM after a graceful shutdown; the service's
        # server does not (service/__main__.py): a requested, drained stop exits 0.
        assert code == 0, f"exit code {code} after SIGTERM:\n{server_log()}"
        log_text = log_path.read_text(errors="replace")
        assert "Application shutdown complete" in log_text, server_log()
        assert "Finished server process" in log_text, server_log()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
