"""The multi-process service (``python -m service`` with ``MT_PROCESS_MODE=multi``) under
faults: a live server of two front-ends and one engine core serving the tiny model, under
concurrent load, has a process killed with SIGKILL.

* An engine core: the requests in flight on it get 503 with Retry-After within a second, the
  supervisor restarts it, requests succeed again within 30 s, and every 200 answered is the
  text's translation alone.
* A front-end: the requests in flight on it are lost with their connections, the other
  front-end keeps serving every request sent after, and the supervisor restarts it.
* SIGTERM drains and stops every process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import free_port
from tests.process_tree import children, multiprocess_env, start_service, stop_service
from tests.service_fixtures import tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "Save changes",
    "Open the file in a new window",
    "Delete all files",
    "Print this folder with your account",
    "Search and replace in all files of this folder",
    "Your password is not valid",
    "Cancel the changes to this file",
    "Edit the settings of your account",
]
CLIENTS = 6
READY_TIMEOUT_S = 120


@dataclass
class Server:
    base: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def pids(self, role: str) -> list[int]:
        return [pid for pid, command in children(self.process.pid).items() if role in command]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    model_dir = tiny_model(tmp_path_factory)
    root = tmp_path_factory.mktemp("multiprocess")
    port = free_port()
    env = multiprocess_env(MT_EXPORTS=str(model_dir), MT_DATA_DIR=str(root / "data"))
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        process = start_service(port, env, log)
    served = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_until(lambda: ready(served), "the server is ready", READY_TIMEOUT_S, served)
        yield served
    finally:
        stop_service(process)


def ready(server: Server) -> bool:
    assert server.process.poll() is None, f"the server exited:\n{server.log()}"
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{server.base}/ready", timeout=2).status_code == 200
    return False


def wait_until(condition, what: str, timeout_s: float, server: Server) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}\n{server.log()}"
        time.sleep(0.05)


@dataclass
class Answer:
    text: str
    sent: float
    done: float
    status: int | None  # None: the connection failed
    retry_after: str | None = None
    translation: str | None = None


def translate(client: httpx.Client, text: str) -> Answer:
    sent = time.monotonic()
    try:
        response = client.post("/v1/translate", json={"text": text})
    except httpx.TransportError:
        return Answer(text, sent, time.monotonic(), None)
    done = time.monotonic()
    translation = response.json()["translations"][0]["text"] if response.is_success else None
    return Answer(
        text, sent, done, response.status_code, response.headers.get("retry-after"), translation
    )


class Load:
    """``CLIENTS`` threads translating the texts in turn, each request on a new connection
    (a kept-alive one would stay tied to the front-end that accepted it)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(offset,), daemon=True)
            for offset in range(CLIENTS)
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, offset: int) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.base, timeout=30, limits=limits) as client:
            index = offset
            while not self._stop.is_set():
                answer = translate(client, TEXTS[index % len(TEXTS)])
                self.answers.append(answer)
                index += 1
                if answer.status != 200:
                    time.sleep(0.02)  # a refused client backs off a little

    def count(self, status: int | None, sent_after: float = 0.0) -> int:
        return sum(a.status == status and a.sent > sent_after for a in list(self.answers))


@pytest.fixture(scope="module")
def alone(server) -> dict[str, str]:
    """Each text translated alone, one request at a time."""
    with httpx.Client(base_url=server.base, timeout=30) as client:
        answers = {text: translate(client, text) for text in TEXTS}
    assert all(answer.status == 200 for answer in answers.values()), server.log()
    return {text: answer.translation or "" for text, answer in answers.items()}


def test_the_plan_is_on_metrics_and_each_process_kind_runs(server):
    metrics = httpx.get(f"{server.base}/metrics", timeout=5).text
    assert 'mt_process_plan{count="frontends"} 2.0' in metrics
    assert 'mt_process_plan{count="engine_replicas"} 1.0' in metrics
    assert len(server.pids("service.processes.frontend")) == 2
    assert len(server.pids("service.processes.engine_process")) == 1


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of a /metrics exposition (0 where it is absent)."""
    for family in text_string_to_metric_families(metrics):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return found.value
    return 0.0


def test_metrics_of_any_frontend_show_the_engine_cores_work(server):
    def scrape() -> str:
        return httpx.get(f"{server.base}/metrics", timeout=5).text

    before = scrape()
    with httpx.Client(base_url=server.base, timeout=30) as client:
        assert translate(client, "Open the file in a new window").status == 200
    # the front-ends run no batcher: these come from the engine core's process
    names = ("mt_decode_steps_total", "mt_queue_wait_seconds_count", "mt_batch_rows_count")

    def grew() -> bool:
        now = scrape()
        return all(sample(now, name) > sample(before, name) for name in names)

    wait_until(grew, "the engine core's counters grow on /metrics", 5, server)
    wait_until(
        lambda: sample(scrape(), "mt_thread_cpu_seconds_total", thread="engine") > 0,
        "the engine thread's CPU seconds show",
        5,
        server,
    )
    assert sample(scrape(), "mt_requests_total", route="/v1/translate", status="200") >= 1


def test_a_killed_engine_core_answers_503_at_once_and_is_restarted(server, alone):
    [core] = server.pids("service.processes.engine_process")
    with Load(server.base) as load:
        wait_until(lambda: load.count(200) >= 2 * CLIENTS, "load is flowing", 30, server)
        os.kill(core, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(
            lambda: load.count(200, sent_after=killed_at) >= CLIENTS,
            "requests succeed again",
            30,
            server,
        )
    answers = load.answers
    in_flight = [a for a in answers if a.sent < killed_at < a.done]
    late = [round(a.done - killed_at, 3) for a in in_flight if a.done - killed_at >= 1.0]
    assert not late, f"requests in flight at the kill answered only after {late} s"
    assert any(a.status == 503 for a in in_flight), "the kill hit no request in flight"
    refused = [a for a in answers if a.status != 200]
    assert all(a.status == 503 and a.retry_after for a in refused), {a.status for a in refused}
    wrong = [
        (a.text, a.translation)
        for a in answers
        if a.status == 200 and a.translation != alone[a.text]
    ]
    assert not wrong
    assert server.pids("service.processes.engine_process") not in ([], [core])


def test_a_killed_frontend_leaves_the_other_serving_and_is_restarted(server, alone):
    first, second = server.pids("service.processes.frontend")
    with Load(server.base) as load:
        wait_until(lambda: load.count(200) >= 2 * CLIENTS, "load is flowing", 30, server)
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(
            lambda: load.count(200, sent_after=killed_at + 0.1) >= 4 * CLIENTS,
            "the other front-end serves",
            30,
            server,
        )
    after = [a for a in load.answers if a.sent > killed_at + 0.1]
    assert all(a.status == 200 for a in after), {a.status for a in after}
    assert all(a.translation == alone[a.text] for a in load.answers if a.status == 200)
    lost = [a for a in load.answers if a.status is None]
    assert all(a.sent < killed_at + 0.1 for a in lost)
    wait_until(
        lambda: len(set(server.pids("service.processes.frontend")) - {first}) == 2,
        "the front-end is restarted",
        30,
        server,
    )
    assert second in server.pids("service.processes.frontend")


def test_sigterm_drains_and_stops_every_process(server):
    pids = list(children(server.process.pid))
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0, server.log()
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]
