"""Two service processes on one PostgreSQL database behave as one service
(``MT_DATABASE_URL``): a glossary or a memory stored through one is applied by the other, a
document job submitted to one is finished and downloaded through the other, a key's rate
limit holds across both, and killing the replica that translates a job lets the other finish
it once the lease runs out. Real processes (``python -m service``) with the tiny model, a real
PostgreSQL (tests/postgres_server.py; skipped with the reason where none can be started).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port
from tests.service_fixtures import tiny_model

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2.0
KEY = {"Authorization": "Bearer k1"}


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    base: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=KEY, timeout=30)


def wait_ready(replica: Replica, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if replica.process.poll() is not None:
            raise AssertionError(f"the replica exited with {replica.process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{replica.base}/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError("the replica never became ready")


@contextlib.contextmanager
def replica(model_dir: Path, database_url: str, workdir: Path) -> Iterator[Replica]:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    keys = workdir / "keys.json"
    keys.write_text(json.dumps({"k1": {}, "limited": {"requests_per_minute": 3}}))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MT_EXPORTS": str(model_dir),
        "MT_PROVIDER": "cpu",
        "MT_INTRA_OP_THREADS": "1",
        "MT_DATABASE_URL": database_url,
        "MT_DOCUMENT_LEASE_S": str(LEASE_S),
        "MT_API_KEYS_FILE": str(keys),
        "MT_DATA_DIR": str(workdir / "data"),  # unused with a database: each its own
        "MT_FILES_DIR": str(workdir / "files"),
        "MT_ACCESS_LOG": "false",
        "MT_LANGUAGE_DETECTION": "false",
        # One process per replica, so that killing it kills the replica and its process id is
        # the one a job's lease names (its front-ends share the store as replicas do).
        "MT_PROCESS_MODE": "single",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield Replica(process, f"http://127.0.0.1:{port}")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory, postgres_server) -> Iterator[tuple[Replica, Replica, str]]:
    from tests.postgres_server import fresh_database

    model_dir = tiny_model(tmp_path_factory)
    root = tmp_path_factory.mktemp("replicas")
    with (
        fresh_database(postgres_server) as url,
        replica(model_dir, url, root / "a") as a,
        replica(model_dir, url, root / "b") as b,
    ):
        wait_ready(a)
        wait_ready(b)
        yield a, b, url


def test_a_glossary_and_a_memory_stored_on_one_replica_are_applied_by_the_other(two_replicas):
    a, b, _ = two_replicas
    with a.client() as on_a, b.client() as on_b:
        created = on_a.post(
            "/v1/glossaries",
            json={
                "name": "ui",
                "source_lang": "en",
                "target_lang": "de",
                "entries": {"save": "Q7z"},
            },
        )
        assert created.status_code == 201, created.text
        gid = created.json()["glossary_id"]
        out = on_b.post("/v1/translate", json={"text": "Save the file.", "glossary_id": gid})
        assert out.status_code == 200, out.text
        assert out.json()["translations"][0]["text"].count("Q7z") == 1
        posted = on_b.post(
            "/v1/memories",
            json={"source_lang": "en", "target_lang": "de", "entries": {"Quit now": "Beenden"}},
        )
        assert posted.status_code in (200, 201), posted.text
        remembered = on_a.post("/v1/translate", json={"text": "Quit now"})
        assert remembered.json()["translations"][0]["text"] == "Beenden"
        assert on_b.delete(f"/v1/glossaries/{gid}").status_code in (200, 204)
        gone = on_a.post("/v1/translate", json={"text": "Save.", "glossary_id": gid})
        assert gone.status_code == 404


def test_a_keys_rate_limit_holds_across_both_replicas(two_replicas):
    a, b, _ = two_replicas
    statuses = []
    for n in range(5):
        replica_now = (a, b)[n % 2]
        response = httpx.post(
            f"{replica_now.base}/v1/translate",
            json={"text": f"Hello {n}."},
            headers={"Authorization": "Bearer limited"},
            timeout=30,
        )
        statuses.append(response.status_code)
    assert statuses == [200, 200, 200, 429, 429]  # 3 per minute for the key, not 3 per replica


def lines(count: int) -> bytes:
    return "".join(f"Open the file number {n}.\n" for n in range(count)).encode()


def submit(client: httpx.Client, content: bytes) -> str:
    created = client.post(
        "/v1/documents",
        data={"source_lang": "en", "target_lang": "de"},
        files={"file": ("notes.txt", content)},
    )
    assert created.status_code == 202, created.text
    return created.json()["id"]


def wait_status(client: httpx.Client, job_id: str, done: bool, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.get(f"/v1/documents/{job_id}").json()
        finished = status["status"] not in ("queued", "translating")
        if finished if done else status["sentences_done"] > 0:
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id}: {status}")


def test_a_job_submitted_on_one_replica_is_downloaded_from_the_other(two_replicas):
    a, b, _ = two_replicas
    with a.client() as on_a, b.client() as on_b:
        job_id = submit(on_a, lines(6))
        status = wait_status(on_b, job_id, done=True, timeout_s=120)
        assert status["status"] == "done", status
        result = on_b.get(f"/v1/documents/{job_id}/result")
        assert result.status_code == 200
        assert result.content == on_a.get(f"/v1/documents/{job_id}/result").content
        assert len(result.content.decode().splitlines()) == 6


def holder_pid(database_url: str, job_id: str) -> int:
    import psycopg

    with psycopg.connect(database_url) as connection:
        (holder,) = connection.execute(
            "SELECT lease_holder FROM document_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    return int(holder.split("/")[1])  # host/pid/random (service/storage/document_claims.py)


def test_killing_the_replica_that_runs_a_job_lets_the_other_finish_it(two_replicas):
    a, b, url = two_replicas
    with a.client() as on_a:
        job_id = submit(on_a, lines(400))
        progress = wait_status(on_a, job_id, done=False, timeout_s=60)
    assert progress["status"] == "translating", progress  # killed mid-job, not after it
    victim, survivor = (a, b) if holder_pid(url, job_id) == a.process.pid else (b, a)
    victim.process.kill()  # no goodbye: its lease is left to run out
    victim.process.wait(10)
    killed_at = time.monotonic()
    deadline = killed_at + LEASE_S + 15  # the lease, a poll, and a slow machine's start
    while holder_pid(url, job_id) != survivor.process.pid:
        assert time.monotonic() < deadline, "the job was not taken over within the lease"
        time.sleep(0.1)
    with survivor.client() as client:
        done = wait_status(client, job_id, done=True, timeout_s=300)
        assert done["status"] == "done", done
        result = client.get(f"/v1/documents/{job_id}/result")
        assert len(result.content.decode().splitlines()) == 400


def test_a_replica_without_its_database_is_not_ready_and_answers_503_not_500(
    tmp_path_factory, tmp_path
):
    from fastapi.testclient import TestClient

    from service.config import Settings
    from service.wiring import create_app

    settings = Settings(
        exports=[tiny_model(tmp_path_factory)],
        provider="cpu",
        intra_op_threads=1,
        files_dir=tmp_path / "files",
        data_dir=tmp_path / "data",
        database_url=f"postgresql://mt:secret@127.0.0.1:{free_port()}/mt",  # nobody listens
    )
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 120
        while (ready := client.get("/ready")).json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert ready.status_code == 503 and ready.json()["status"] == "store_unavailable"
        assert "secret" not in ready.text and "Retry-After" in ready.headers
        for method, path, body in [
            (
                "POST",
                "/v1/glossaries",
                {"name": "g", "source_lang": "en", "target_lang": "de", "entries": {"a": "b"}},
            ),
            ("GET", "/v1/glossaries", None),
            ("POST", "/v1/translate", {"text": "Save the file."}),
            ("GET", "/v1/documents/0123", None),
        ]:
            response = client.request(method, path, json=body)
            assert response.status_code == 503, (path, response.text)
            assert "Retry-After" in response.headers and "secret" not in response.text
