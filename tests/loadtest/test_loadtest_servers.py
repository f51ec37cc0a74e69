"""Where the load goes and what it runs on: loopback targets only, the spawned server stopped
with the run, the generator's clients, CPU pinning, and the machine each result records."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.client import (
    REPO_ROOT,
    check_target,
    is_loopback_url,
)


def test_only_loopback_targets_are_allowed_by_default():
    assert is_loopback_url("http://127.0.0.1:8000") and is_loopback_url("http://localhost:1")
    assert is_loopback_url("http://[::1]:8000")
    assert not is_loopback_url("http://10.0.0.5:8000") and not is_loopback_url(
        "https://example.com"
    )
    with pytest.raises(SystemExit):
        check_target("http://example.com", allow_remote=False)
    check_target("http://example.com", allow_remote=True)


def test_a_run_ended_by_sigterm_stops_the_server_it_spawned():
    """``kill`` of a load run (what ``python -m loadtest`` sets up): the spawned server is
    stopped, not left running beside the next measurement."""
    stub = [sys.executable, "-m", "loadtest.stub_server", "--port", "{port}", "--base-ms", "1"]
    script = (
        "import sys, time\n"
        "from loadtest.client import exit_on_sigterm, spawned_process\n"
        "exit_on_sigterm()\n"
        f"with spawned_process(None, command={stub!r}, ready_timeout_s=60) as (url, server):\n"
        "    print(server.pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        server_pid = int(run.stdout.readline())
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # stopped and reaped, not orphaned
            os.kill(server_pid, 0)
    finally:
        run.kill()


def test_the_generators_client_keeps_one_raw_client_per_service_and_httpx_for_https():
    import httpx

    from loadtest.raw_http import RawClient, RawClients

    clients = RawClients(max_connections=4, timeout_s=1.0)
    first = clients._for("http://127.0.0.1:8001/v1/translate")
    assert isinstance(first, RawClient) and (first.host, first.port) == ("127.0.0.1", 8001)
    assert clients._for("http://127.0.0.1:8001/metrics") is first
    assert clients._for("http://127.0.0.1:8002/metrics") is not first
    assert isinstance(clients._for("https://mt.example.com/v1/translate"), httpx.AsyncClient)
    asyncio.run(clients.aclose())


AVX2_ONLY_CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
processor\t: 1
flags\t\t: fpu sse sse2 avx512f
"""


def test_simd_flags_are_the_kernel_deciding_ones_of_the_first_processor():
    from loadtest.machine import cpu_model, simd_flags

    assert simd_flags(AVX2_ONLY_CPUINFO) == ["avx", "avx2", "fma"]
    assert cpu_model(AVX2_ONLY_CPUINFO) == "AMD EPYC 7B13"
    assert simd_flags("processor\t: 0\n") == []


def test_every_result_json_records_the_machine(tmp_path):
    import re
    from pathlib import Path

    from loadtest.report import write_json

    path = write_json(tmp_path / "run.json", {"kind": "open_loop", "summary": {"ok": 3}})
    document = json.loads(path.read_text())
    assert document["kind"] == "open_loop" and document["summary"] == {"ok": 3}
    machine = document["machine"]
    assert machine["logical_cpus"] >= 1 and machine["cpu"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # the flags as grep would find them on this machine
        first = re.search(r"^flags\s*:(.*)$", cpuinfo.read_text(), re.MULTILINE)
        expected = sorted({f for f in first.group(1).split() if re.match(r"(avx|fma|amx)", f)})
        assert machine["simd"] == expected
    # a document that names its machine keeps it
    kept = write_json(tmp_path / "own.json", {"machine": {"cpu": "given"}})
    assert json.loads(kept.read_text())["machine"] == {"cpu": "given"}


def test_the_server_runs_under_taskset_and_the_generator_is_pinned_elsewhere(monkeypatch):
    import argparse

    from loadtest.client import cpu_list, pin_client, server_command

    assert cpu_list("0,2-3") == {0, 2, 3}
    with pytest.raises(SystemExit, match="not a CPU list"):
        cpu_list("zero")
    args = argparse.Namespace(server_command=None, server_cpus="0", client_cpus="1")
    command = server_command(args)
    assert command[:3] == ["taskset", "-c", "0"] and "{port}" in command
    assert command[3:6] == [sys.executable, "-m", "service"]
    pinned: list[set[int]] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append(set(cpus)))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})
    pin_client(args)
    assert pinned == [{1}]
    no_pinning = argparse.Namespace(server_command="stub {port}", server_cpus=None)
    assert server_command(no_pinning) == ["stub", "{port}"]


def test_paired_cores_script_parses():
    script = Path(__file__).resolve().parents[2] / "loadtest" / "paired_cores.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
