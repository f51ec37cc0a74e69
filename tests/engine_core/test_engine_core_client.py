"""Engine cores in processes of their own (service/engine_core/): the messages, the process
plan, and a client against real engine-core processes serving the tiny model, which must give
exactly what the in-process batcher gives, and fail fast and recover when a core dies."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cpus import CpuBudget
from service.engine_core.client import EngineCoreClient
from service.engine_core.control import probe
from service.engine_core.plan import ProcessPlan, plan_processes, runs_split
from service.engine_core.protocol import (
    Accepted,
    Failed,
    Row,
    RowDone,
    RowsDone,
    decode_from_core,
    decode_to_core,
    encode,
    error_of,
    failure_of,
    submit,
)
from service.errors import EngineFailure, EngineUnavailable, InvalidRow, NotAccepting, QueueFull
from service.runtime.engine import Engine
from service.runtime.types import DecodeRequest
from service.scheduling.batcher import ContinuousBatcher
from service.scheduling.sentences import RowResult
from service.text.tokenizer import Tokenizer
from tests.service_fixtures import tiny_model

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "Save changes",
    "Open the file in a new window",
    "Delete all files",
    "Print this folder with your account",
    "Search and replace in all files of this folder",
    "Cancel the changes to this file",
]


@pytest.fixture
def anyio_backend():
    return "asyncio"


# --- messages and plan ------------------------------------------------------------------------


def test_a_submit_round_trips_ids_and_options():
    row = DecodeRequest(
        src_ids=(5, 6, 0),
        beam_size=4,
        max_new_tokens=17,
        length_penalty=0.6,
        copy_tokens={3: 1, 4: 0},
        forced_prefix=(9,),
    )
    message = decode_to_core(encode(submit(7, [row], True, 2.5)))
    assert message.request_id == 7 and message.background and message.timeout_s == 2.5
    assert message.rows == [Row.of(row)]
    assert message.rows[0].request() == row
    assert not message.acknowledge
    assert decode_to_core(encode(submit(7, [row], False, None, acknowledge=True))).acknowledge
    assert decode_from_core(encode(Accepted(7))) == Accepted(7)


def test_a_steps_finished_rows_round_trip_in_one_message():
    first = RowResult([4, 5], 3, 9, 0.25, [[4, 5], [4, 6]])
    second = RowResult([7], 8, 9, 0.5)
    message = decode_from_core(
        encode(RowsDone([RowDone.of(1, 2, first), RowDone.of(4, 0, second)]))
    )
    assert isinstance(message, RowsDone)
    assert [(row.request_id, row.index) for row in message.rows] == [(1, 2), (4, 0)]
    assert [row.result() for row in message.rows] == [first, second]


@pytest.mark.parametrize(
    "error",
    [
        QueueFull("the queue is full"),
        NotAccepting("engine_stopped"),
        TimeoutError(),
        InvalidRow("the sentence cannot be decoded: too long"),
        EngineFailure("the engine failed during decoding (RuntimeError)"),
    ],
)
def test_a_failure_is_raised_again_as_the_same_domain_error(error):
    failed = decode_from_core(encode(failure_of(3, error)))
    assert isinstance(failed, Failed)
    again = error_of(failed)
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert getattr(again, "code", None) == getattr(error, "code", None)


def test_an_unknown_engine_error_is_an_engine_failure():
    again = error_of(failure_of(3, ValueError("a path /secret")))
    assert isinstance(again, EngineFailure) and "secret" not in again.message


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [
        (1, (1, 1, 1)),
        (2, (1, 1, 1)),
        (3, (1, 1, 2)),
        (4, (1, 1, 3)),
        (8, (2, 2, 3)),
        (16, (4, 3, 4)),
    ],
)
def test_the_plan_follows_the_cpu_budget(cpus, expected):
    plan = plan_processes(CpuBudget(cpus, cpus, None, "affinity"))
    assert (plan.frontends, plan.engine_replicas, plan.intra_op_threads) == expected


@pytest.mark.parametrize(
    ("mode", "cpus", "gpu", "split"),
    [
        ("auto", 1, False, False),
        ("auto", 1, True, True),
        ("auto", 2, False, False),
        ("auto", 4, False, True),
        ("multi", 1, False, True),
        ("single", 16, True, False),
    ],
)
def test_auto_splits_the_processes_with_a_gpu_or_four_cpus(mode, cpus, gpu, split):
    assert runs_split(mode, CpuBudget(cpus, cpus, None, "affinity"), gpu) is split


def test_the_plan_takes_overrides_and_one_engine_core_on_a_gpu(tmp_path):
    budget = CpuBudget(16, 16, None, "affinity")
    assert plan_processes(budget, gpu=True).engine_replicas == 1
    plan = plan_processes(budget, frontends=3, engine_replicas=2, intra_op_threads=5)
    assert (plan.frontends, plan.engine_replicas, plan.intra_op_threads) == (3, 2, 5)
    plan = plan.with_addresses(tmp_path, ["a", "b"])
    assert plan.addresses["b"] == [
        f"ipc://{tmp_path}/engine-1-0-g0.sock",
        f"ipc://{tmp_path}/engine-1-1-g0.sock",
    ]
    assert ProcessPlan.from_json(plan.to_json()) == plan


# --- a client against engine-core processes ----------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def engine_core_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MT_")}
    env.update(MT_PROVIDER="cpu", MT_LOG_LEVEL="warning", MT_SHUTDOWN_GRACE_S="2")
    return env


def start_engine_core(model_dir: Path, address: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "service.processes.engine_process", "--model-id", "tiny"]
    argv += ["--model-dir", str(model_dir), "--address", address, "--threads", "1"]
    return subprocess.Popen(argv, cwd=ROOT, env=engine_core_env())


class EngineCores:
    """Two engine-core processes of the tiny model, each restartable."""

    def __init__(self, model_dir: Path, run_dir: Path) -> None:
        self.model_dir = model_dir
        self.addresses = [f"ipc://{run_dir}/core-{index}.sock" for index in range(2)]
        self.processes = [start_engine_core(model_dir, address) for address in self.addresses]

    def restart(self, index: int) -> None:
        self.processes[index] = start_engine_core(self.model_dir, self.addresses[index])

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def engine_cores(model_dir) -> Iterator[EngineCores]:
    run_dir = Path(tempfile.mkdtemp(prefix="mt-cores-"))  # short: ipc paths are bounded
    cores = EngineCores(model_dir, run_dir)
    try:
        yield cores
    finally:
        cores.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def rows(model_dir) -> list[DecodeRequest]:
    tokenizer = Tokenizer.from_dir(model_dir)
    ids = [tuple(tokenizer.encode_one(text)) for text in TEXTS]
    # Long enough that a kill finds rows mid-decode, not only answers not yet read.
    greedy = [DecodeRequest(src_ids=src, max_new_tokens=48) for src in ids]
    beams = [DecodeRequest(src_ids=src, beam_size=3, max_new_tokens=24) for src in ids[:3]]
    return greedy + beams


@pytest.fixture(scope="module")
def in_process(model_dir, rows) -> list[RowResult]:
    """What the one-process batcher answers for ``rows``."""

    async def decode() -> list[RowResult]:
        engine = Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1)
        batcher = ContinuousBatcher(engine)
        batcher.start()
        try:
            return await batcher.submit(rows)
        finally:
            batcher.close()

    return asyncio.run(decode())


async def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.02)


def same(results: list[RowResult], expected: list[RowResult]) -> bool:
    return [(r.tokens, r.hypotheses) for r in results] == [
        (r.tokens, r.hypotheses) for r in expected
    ]


@contextlib.asynccontextmanager
async def connected(cores: EngineCores):
    pong = await asyncio.to_thread(probe, cores.addresses, 120.0)
    client = EngineCoreClient(cores.addresses, pong.info)
    client.start()
    try:
        await wait_for(lambda: client.live_replicas == len(cores.addresses), "both cores live")
        yield client
    finally:
        await client.shutdown(1.0)


@pytest.mark.anyio
async def test_engine_cores_answer_what_the_in_process_batcher_answers(
    engine_cores, rows, in_process
):
    async with connected(engine_cores) as client:
        assert client.info.model_id == "tiny" and client.info.provider == "cpu"
        assert same(await client.submit(rows, timeout_s=60), in_process)
        # rows one request at a time spread over both replicas; greedy and beam alike
        each = await asyncio.gather(*(client.submit([row], timeout_s=60) for row in rows))
        assert same([result for [result] in each], in_process)
        streamed = {}
        async with contextlib.aclosing(client.submit_as_completed(rows, timeout_s=60)) as done:
            await done.started()  # the core's Accepted
            async for index, result in done:
                streamed[index] = result
        assert same([streamed[i] for i in range(len(rows))], in_process)
        assert client._requests == {}
        assert all(replica.outstanding_rows == 0 for replica in client.replicas)


@pytest.mark.anyio
async def test_a_timeout_abandons_the_rows(engine_cores, rows, in_process):
    async with connected(engine_cores) as client:
        with pytest.raises(TimeoutError):
            await client.submit(rows, timeout_s=0.001)
        assert client._requests == {}
        assert all(replica.outstanding_rows == 0 for replica in client.replicas)
        assert same(await client.submit(rows, timeout_s=60), in_process)


async def keep_busy(client: EngineCoreClient, rows: list[DecodeRequest], stop: asyncio.Event):
    """Submit ``rows`` one at a time, again and again, until ``stop``: (row index, answer)."""
    answers: list[tuple[int, RowResult | EngineUnavailable]] = []
    while not stop.is_set():
        for index, row in enumerate(rows):
            try:
                [result] = await client.submit([row], timeout_s=60)
                answers.append((index, result))
            except EngineUnavailable as error:
                answers.append((index, error))
                await asyncio.sleep(0.01)
    return answers


@pytest.mark.anyio
async def test_a_killed_engine_core_fails_its_rows_at_once_and_traffic_resumes(
    engine_cores, rows, in_process
):
    async with connected(engine_cores) as client:
        stop = asyncio.Event()
        workers = [asyncio.create_task(keep_busy(client, rows, stop)) for _ in range(6)]
        victim, replica = engine_cores.processes[0], client.replicas[0]
        await wait_for(lambda: replica.requests, "rows in flight on the first core")
        in_flight = [s.future for r in replica.requests.values() for s in r.sentences]
        victim.kill()
        killed_at = time.monotonic()
        await wait_for(lambda: all(f.done() for f in in_flight), "its rows answered", 1.0)
        assert time.monotonic() - killed_at < 1.0
        failed = [f for f in in_flight if f.exception() is not None]
        # a row may have finished just before the kill; the others fail with 503
        assert failed and all(isinstance(f.exception(), EngineUnavailable) for f in failed)
        assert client.live_replicas == 1
        # new rows go to the live replica and are answered right
        assert same(await client.submit(rows, timeout_s=60), in_process)
        victim.wait()
        engine_cores.restart(0)
        await wait_for(lambda: client.live_replicas == 2, "the restarted core is live again")
        each = await asyncio.gather(*(client.submit([row], timeout_s=60) for row in rows))
        assert same([result for [result] in each], in_process)
        stop.set()
        answers = [answer for worker in workers for answer in await worker]
        results = [(index, a) for index, a in answers if isinstance(a, RowResult)]
        assert len(results) > len(rows)
        assert all(same([result], [in_process[index]]) for index, result in results)
