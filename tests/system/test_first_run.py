"""What a newcomer meets first: `make serve` (what it installs, where it listens), the server
as a process (a clean exit on SIGTERM), and the server as the images run it (a user that
owns nothing, in a directory it cannot write)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port
from tests.ready import wait_ready
from tests.service_fixtures import tiny_model

ROOT = Path(__file__).resolve().parents[2]
IMAGE_UID = 10001  # the user the Docker images run as
READY_TIMEOUT_S = 120


def dry_run(*args: str, **env: str) -> str:
    """``make -n -B`` of ``args`` with a venv that does not exist: every recipe on the way,
    as a fresh machine would run it."""
    result = subprocess.run(
        ["make", "-n", "-B", "VENV=/nonexistent/venv", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def pip_installs(commands: str) -> list[str]:
    return [line for line in commands.splitlines() if "pip install" in line]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_serve_installs_what_serving_needs_and_not_the_dev_extras():
    serve, test = dry_run("serve"), dry_run("test")
    assert pip_installs(serve), serve
    assert not [line for line in pip_installs(serve) if "dev" in line], serve
    assert [line for line in pip_installs(test) if "dev" in line], test
    # Each install stage says what it is doing (pip itself stays -q).
    assert serve.count("echo ") >= len(pip_installs(serve)) - 1, serve


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_serve_listens_where_mt_host_and_mt_port_say():
    [default] = [line for line in dry_run("serve").splitlines() if "-m service" in line]
    assert default.endswith("--host 0.0.0.0 --port 8000"), default
    [chosen] = [
        line
        for line in dry_run("serve", MT_PORT="9123", MT_HOST="127.0.0.1").splitlines()
        if "-m service" in line
    ]
    assert chosen.endswith("--host 127.0.0.1 --port 9123"), chosen
    [flag] = [line for line in dry_run("serve", "PORT=9000").splitlines() if "-m service" in line]
    assert flag.endswith("--port 9000"), flag


@pytest.fixture(scope="module")
def shared_model_dir(tmp_path_factory) -> Iterator[Path]:
    """The tiny model where any user may read it (pytest's temporary directories are the
    owner's alone)."""
    root = Path(tempfile.mkdtemp(prefix="mt-first-run-"))
    model_dir = root / "model"
    shutil.copytree(tiny_model(tmp_path_factory), model_dir)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield model_dir
    shutil.rmtree(root, ignore_errors=True)


class ImageUser:
    """How to run the server as a user without root's powers over files: uid 10001, as the
    images do, where this interpreter is reachable by it; else root without capabilities
    (``setpriv``), for which a directory's permission bits hold as for anyone (this
    interpreter may live under /root, which other users cannot enter)."""

    def __init__(self) -> None:
        self.uid: int | None = IMAGE_UID
        self.prefix: list[str] = []
        try:
            probe = subprocess.run([sys.executable, "-c", ""], user=IMAGE_UID, timeout=60)
            if probe.returncode == 0:
                return
        except PermissionError:
            pass
        if shutil.which("setpriv") is None:
            pytest.skip("uid 10001 cannot run this interpreter and setpriv is missing")
        self.uid = None
        self.prefix = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"]


class ServerProcess:
    """``python -m service`` on a free port, its output in a log file."""

    def __init__(
        self, model_dir: Path, cwd: Path, log: Path, as_user: ImageUser | None = None
    ) -> None:
        self.port = free_port()
        self.log = log
        env = {key: value for key, value in os.environ.items() if not key.startswith("MT_")} | {
            "PYTHONPATH": str(ROOT),
            "HOME": str(cwd),
            "MT_PROVIDER": "cpu",
            "MT_INTRA_OP_THREADS": "1",
            "MT_SHUTDOWN_GRACE_S": "10",
        }
        command = [*(as_user.prefix if as_user else []), sys.executable, "-m", "service"]
        command += ["--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--model-dir", str(model_dir)]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                user=as_user.uid if as_user else None,
            )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_for(self, path: str, status: int | None = None) -> httpx.Response:
        """The first answer of ``path`` (with ``status``, if given)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert self.process.poll() is None, f"the server exited:\n{self.output()}"
            try:
                response = self.client.get(path)
                if status is None or response.status_code == status:
                    return response
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{path} never answered:\n{self.output()}"
            time.sleep(0.2)

    def wait_for_loaded(self) -> httpx.Response:
        """``/ready``'s first answer once the model is no longer loading."""
        return wait_ready(
            self.client,
            READY_TIMEOUT_S,
            until=lambda answer: answer.json()["status"] != "loading",
            process=self.process,
            log=self.output,
        )

    def close(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def test_the_server_drains_and_exits_0_on_sigterm(shared_model_dir, tmp_path):
    server = ServerProcess(shared_model_dir, tmp_path, tmp_path / "server.log")
    try:
        wait_ready(server.client, READY_TIMEOUT_S, process=server.process, log=server.output)
        translated = server.client.post("/v1/translate", json={"text": "Save the file."})
        assert translated.status_code == 200, translated.text
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=40)
        assert code == 0, f"exit status {code} after SIGTERM:\n{server.output()}"
        assert "Application shutdown complete" in server.output()
    finally:
        server.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the server as another user: needs root")
def test_a_user_that_cannot_write_the_data_dir_gets_a_failed_ready_and_no_500(
    shared_model_dir,
):
    # The images' layout: the working directory belongs to root and cannot be written by the
    # server's user, and MT_DATA_DIR keeps its default, the relative path `data`.
    workdir = Path(tempfile.mkdtemp(prefix="mt-read-only-"))
    workdir.chmod(0o555)
    log = Path(tempfile.mkdtemp(prefix="mt-log-")) / "server.log"
    log.parent.chmod(0o777)
    server = ServerProcess(shared_model_dir, workdir, log, as_user=ImageUser())
    try:
        assert server.wait_for("/health", 200).json()["status"] == "ok"
        ready = server.wait_for_loaded()
        assert ready.status_code == 503, ready.text
        assert "MT_DATA_DIR" in ready.json()["detail"] and "not writable" in ready.json()["detail"]
        assert "not writable" in server.output()  # the log says so too
        for path, body in [
            ("/v1/translate", {"text": "Save the file."}),
            ("/translate", {"q": "Save the file.", "source": "en", "target": "de"}),
            (
                "/v1/glossaries",
                {
                    "name": "g",
                    "source_lang": "en",
                    "target_lang": "de",
                    "entries": {"file": "Datei"},
                },
            ),
        ]:
            response = server.client.post(path, json=body)
            assert response.status_code == 503, (path, response.text, server.output())
            assert "Retry-After" in response.headers
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(log.parent, ignore_errors=True)
