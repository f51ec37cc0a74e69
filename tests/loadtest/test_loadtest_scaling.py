"""``python -m loadtest scaling``'s pieces that need no server: the capacity projection, CPU
per request by process kind, the service's process tree read from a fake ``/proc``, the shape
argument and the Markdown summary."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from loadtest.cpu_accounting import (
    ProcessCpu,
    cpu_by_kind,
    process_cpu_seconds,
    projected_capacity,
    service_processes,
)
from loadtest.scaling import parse_shape
from loadtest.scaling_report import render, write_summary


def test_the_projection_spreads_cpu_over_cores_until_the_serial_share_caps_it():
    # 25 ms of CPU a request in all, of which 10 ms in one process
    projection = projected_capacity([1, 2, 4, 8], 0.025, 0.010)
    assert projection[1]["rps"] == pytest.approx(40.0)
    assert projection[2]["rps"] == pytest.approx(80.0)
    assert not projection[2]["capped"]
    assert projection[4]["rps"] == pytest.approx(100.0)  # 160 spread, capped at 1 / 10 ms
    assert projection[4]["spread_rps"] == pytest.approx(160.0) and projection[4]["capped"]
    assert projection[8]["rps"] == pytest.approx(100.0)


def test_nothing_measured_projects_nothing():
    assert projected_capacity([4], 0.0, 0.0)[4]["rps"] is None
    assert projected_capacity([4], 0.01, 0.0)[4] == {
        "rps": pytest.approx(400.0),
        "spread_rps": pytest.approx(400.0),
        "serial_cap_rps": None,
        "capped": False,
    }


def test_cpu_per_request_by_kind_counts_a_restarted_process_from_zero():
    before = [
        ProcessCpu(1, "supervisor", 1.0, {1: 1.0}),
        ProcessCpu(2, "frontend", 10.0, {2: 9.0, 20: 1.0}),
        ProcessCpu(3, "frontend", 5.0, {3: 5.0}),
        ProcessCpu(4, "engine_core", 50.0, {4: 10.0, 40: 40.0}),
        ProcessCpu(5, "engine_core", 30.0, {5: 30.0}),  # dies in the window
    ]
    after = [
        ProcessCpu(1, "supervisor", 1.1, {1: 1.1}),
        ProcessCpu(2, "frontend", 12.0, {2: 10.5, 20: 1.5}),
        ProcessCpu(3, "frontend", 6.0, {3: 6.0}),
        ProcessCpu(4, "engine_core", 56.0, {4: 11.0, 40: 45.0}),
        ProcessCpu(6, "engine_core", 2.0, {6: 2.0}),  # its restart
    ]
    cpu = cpu_by_kind(before, after, requests=100, window_s=10.0)
    frontend, engine = cpu["by_kind"]["frontend"], cpu["by_kind"]["engine_core"]
    assert frontend["processes"] == 2 and frontend["cpu_s"] == pytest.approx(3.0)
    assert frontend["cpu_s_per_request"] == pytest.approx(0.03)
    assert frontend["busiest_process_cpu_s_per_request"] == pytest.approx(0.02)
    assert frontend["busiest_thread_cpu_s_per_request"] == pytest.approx(0.015)
    assert engine["cpu_s"] == pytest.approx(8.0) and engine["cores_busy"] == pytest.approx(0.8)
    assert cpu["total_cpu_s_per_request"] == pytest.approx(0.111)
    assert cpu["serial_cpu_s_per_request"] == pytest.approx(0.06)  # engine core 4
    assert cpu["busiest_thread_cpu_s_per_request"] == pytest.approx(0.05)
    assert cpu["processes_gone"] == 1


def fake_process(proc, pid: int, ppid: int, command: str, utime: int, stime: int) -> None:
    folder = proc / str(pid)
    (folder / "task" / str(pid)).mkdir(parents=True)
    # fields after the name: state ppid ... utime (14th field) and stime (15th)
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 5
    (folder / "stat").write_text(f"{pid} (py thon) " + " ".join(fields))
    (folder / "cmdline").write_bytes(command.replace(" ", "\0").encode())


@pytest.mark.parametrize("children_files", [False, True])
def test_the_service_processes_are_the_root_and_its_frontends_and_engine_cores(
    tmp_path, children_files
):
    fake_process(tmp_path, 10, 1, "python -m service --port 1", 100, 50)
    fake_process(tmp_path, 11, 10, "python -m service.processes.frontend --fd 3", 7, 0)
    fake_process(tmp_path, 12, 10, "python -m service.processes.engine_process --x", 9, 1)
    fake_process(tmp_path, 13, 10, "taskset -c 0 sleep 1", 0, 0)  # no service process
    fake_process(tmp_path, 14, 11, "python -m service.processes.frontend", 0, 0)  # grandchild
    if children_files:
        (tmp_path / "10" / "task" / "10" / "children").write_text("11 12 13 ")
    assert service_processes(10, tmp_path) == {11: "frontend", 12: "engine_core", 10: "supervisor"}
    assert service_processes(12, tmp_path) == {12: "service"}  # the one-process mode
    assert process_cpu_seconds(10, tmp_path) == pytest.approx(150 / os.sysconf("SC_CLK_TCK"))
    assert process_cpu_seconds(99, tmp_path) is None


def test_a_shape_is_a_name_and_two_cpu_lists():
    assert parse_shape("2shared:0-1:0-1") == {
        "name": "2shared",
        "server_cpus": "0-1",
        "client_cpus": "0-1",
    }
    for bad in ("2shared:0-1", "x:a:1", "::"):
        with pytest.raises((argparse.ArgumentTypeError, SystemExit)):
            parse_shape(bad)


def test_the_summary_has_each_load_the_cpu_by_kind_and_the_projection(tmp_path):
    cpu = cpu_by_kind(
        [ProcessCpu(1, "frontend", 0.0, {}), ProcessCpu(2, "engine_core", 0.0, {})],
        [ProcessCpu(1, "frontend", 1.0, {}), ProcessCpu(2, "engine_core", 3.0, {})],
        requests=200,
        window_s=10.0,
    )
    cpu["projection"] = projected_capacity([4, 8], cpu["total_cpu_s_per_request"], 0.005)
    result = {
        "kind": "scaling",
        "shape": {"name": "1core", "server_cpus": "0", "client_cpus": "1"},
        "machine": {"cpu": "EPYC", "cores": 2, "avx2": True, "avx512f": False},
        "plan": {"frontends": 1.0, "engine_replicas": 1.0, "intra_op_threads": 1.0},
        "capacity_rps": 40.0,
        "loads": [
            {"load_pct": 50, "rate_rps": 20.0, "p50_ms": 80.4, "p99_ms": 250.0, "not_served": 0}
            | {"cpu": cpu},
            {"load_pct": 95, "rate_rps": 38.0, "p50_ms": 200.0, "p99_ms": None, "not_served": 7},
        ],
    }
    text = render([json.loads(json.dumps(result))])  # as read back from the JSON
    assert "| 1core (server 0, client 1) | EPYC, 2 cores, avx2 | 1 FE, 1 EC x 1 thr | 40.0 " in text
    assert "| 95 % | 38 | 200 / – | 7 |" in text
    assert "| 1core | 50 % | engine_core | 1 | 15.00 | 15.00 |" in text
    assert "| **20.00** |" in text
    # 4 cores / 20 ms = 200 req/s spread; 1 / 5 ms = 200 cap; 8 cores: 400 spread
    assert "| 1core | 200 (serial cap 200) | 400 (serial cap 200) |" in text
    (tmp_path / "1core.json").write_text(json.dumps(result))
    (tmp_path / "other.json").write_text(json.dumps({"kind": "closed_loop"}))
    assert write_summary(tmp_path).read_text() == text
