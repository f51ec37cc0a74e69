"""Capacity across machine shapes, with the process plan and where the CPU goes.

For each shape ``name:server-cpus:client-cpus`` (as ``machine_shapes.sh`` takes them) the
service starts as ``make serve`` starts it (``python -m service``, the multi-process mode),
under ``taskset -c server-cpus``, with this load generator pinned to ``client-cpus``. Then:

1. a warm-up (closed loop, unmeasured);
2. **capacity**: ``--concurrency`` closed-loop clients for ``--capacity-duration`` s (or
   ``--capacity`` req/s given);
3. **open loop** at each of ``--loads`` % of it: p50/p99 of the answered requests and the
   requests not served (429/503, errors, arrivals the generator dropped);
4. at the lowest load, **CPU accounting**: user + system seconds of the supervisor, every
   front-end and every engine core (``/proc``) before and after the window, per request and
   per process kind, and the capacity that projects on ``--project-cores`` cores
   (loadtest/cpu_accounting.py).

Each shape's JSON (``RESULTS/NAME.json``) records the machine (CPU model, SIMD flags, cores,
cgroup quota), the plan the service made (``mt_process_plan`` on /metrics and the start-up
log's line); ``RESULTS/summary.md`` has the tables (``python -m loadtest.scaling_report DIR``
writes them again).

    .venv/bin/python -m loadtest scaling 2shared:0-1:0-1 1core:0:1 --duration 30
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.client import (
    REPO_ROOT,
    RESULTS_DIR,
    cpu_list,
    parse_env_pairs,
    run_async,
    scrape_metrics,
    service_command,
    spawned_process,
)
from loadtest.closed_loop import measure_closed_loop
from loadtest.cpu_accounting import cpu_by_kind, projected_capacity, snapshot
from loadtest.inputs import InputSampler, parse_weights
from loadtest.machine import machine_facts
from loadtest.open_loop import measure_open_loop
from loadtest.raw_http import httpx_client
from loadtest.report import write_json
from loadtest.scaling_report import write_summary

PLAN_LINE = re.compile(r"process plan: (.*)")


def parse_shape(text: str) -> dict[str, str]:
    """``name:server-cpus:client-cpus`` (CPU lists as ``taskset`` takes them)."""
    parts = text.split(":")
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"a shape is name:server-cpus:client-cpus, not {text!r}")
    name, server, client = parts
    cpu_list(server), cpu_list(client)  # refuse a bad list before anything starts
    return {"name": name, "server_cpus": server, "client_cpus": client}


def machine() -> dict[str, Any]:
    """``machine_facts`` with what a scaling figure also needs: all cores, the cgroup quota
    and the three flags that pick ONNX Runtime's kernels."""
    from service.cpus import cpu_budget

    facts = machine_facts()
    budget = cpu_budget()
    simd = set(facts["simd"])
    return {
        **facts,
        "cores": os.cpu_count(),
        "cgroup_quota_cpus": budget.quota,
        "cgroup_source": budget.source,
        **{flag: flag in simd for flag in ("avx2", "avx512f", "avx512_vnni")},
    }


async def process_plan(url: str) -> dict[str, float]:
    """The plan on /metrics: ``mt_process_plan`` by count, and ``mt_cpus``."""
    async with httpx_client(2, 10.0) as client:
        samples = await scrape_metrics(client, url) or {}
    plan = {
        dict(labels).get("count", ""): value
        for (name, labels), value in samples.items()
        if name == "mt_process_plan"
    }
    cpus = [value for (name, _), value in samples.items() if name == "mt_cpus"]
    return {**plan, **({"cpus": max(cpus)} if cpus else {})}


def logged_plan(log_path: Path) -> str | None:
    """The supervisor's start-up line: the plan and the CPU budget it was made for."""
    try:
        match = PLAN_LINE.search(log_path.read_text(errors="replace"))
    except OSError:
        return None
    return match.group(1).strip() if match else None


def revision(checkout: Path) -> str | None:
    """The commit the service ran from (with ``+`` where its tree had changes)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return None
    return (head + ("+" if dirty else "")) or None


def sampler(args: argparse.Namespace, seed: int) -> InputSampler:
    return InputSampler(seed=seed, weights=args.mix)


async def measure_shape(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    """Warm-up, capacity, then the open-loop loads (CPU accounted at the lowest)."""
    result: dict[str, Any] = {}
    if args.warmup > 0:
        await measure_closed_loop(
            url,
            sampler(args, args.seed + 1000),
            concurrency=args.concurrency,
            duration_s=args.warmup,
            max_requests=None,
            timeout_s=args.timeout,
        )
    capacity = args.capacity
    if capacity is None:
        _, summary = await measure_closed_loop(
            url,
            sampler(args, args.seed),
            concurrency=args.concurrency,
            duration_s=args.capacity_duration,
            max_requests=None,
            timeout_s=args.timeout,
        )
        result["capacity_run"] = summary
        capacity = summary["throughput_rps"]
    result["capacity_rps"] = capacity
    print(f"  capacity {capacity:.1f} req/s", flush=True)
    loads = []
    accounted = min(args.loads)
    for load in args.loads:
        rate = round(capacity * load / 100, 2)
        before = snapshot(pid) if load == accounted else None
        started = time.perf_counter()
        _, summary = await measure_open_loop(
            url,
            rate,
            sampler(args, args.seed + load),
            duration_s=args.duration,
            count=None,
            seed=args.seed + load,
            max_in_flight=args.max_in_flight,
            timeout_s=args.timeout,
        )
        point = load_point(load, rate, summary)
        if before is not None:
            cpu = cpu_by_kind(before, snapshot(pid), summary["ok"], time.perf_counter() - started)
            cpu["projection"] = projected_capacity(
                args.project_cores, cpu["total_cpu_s_per_request"], cpu["serial_cpu_s_per_request"]
            )
            point["cpu"] = cpu
        print(
            f"  {load} % ({rate} req/s): p50 {point['p50_ms']} ms, p99 {point['p99_ms']} ms, "
            f"{point['not_served']} not served",
            flush=True,
        )
        loads.append(point)
    result["loads"] = loads
    return result


def load_point(load: int, rate: float, summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "load_pct": load,
        "rate_rps": rate,
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
        "throughput_rps": summary["throughput_rps"],
        "not_served": summary["failed"],  # 429/503, errors and dropped arrivals
        "by_status": summary["by_status"],
        "summary": summary,
    }


def run_shape(args: argparse.Namespace, shape: dict[str, str], facts: dict[str, Any]) -> Path:
    name = shape["name"]
    os.sched_setaffinity(0, cpu_list(shape["client_cpus"]))
    log_path = args.results_dir / f"{name}.server.log"
    command = ["taskset", "-c", shape["server_cpus"], *service_command(0)[:-1], "{port}"]
    env = {"MT_PROCESS_MODE": "multi", **parse_env_pairs(args.server_env)}
    print(f"{name}: server on CPUs {shape['server_cpus']}, generator on {shape['client_cpus']}")
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with spawned_process(
        args.model,
        command=command,
        extra_env=env,
        log_path=log_path,
        ready_timeout_s=args.ready_timeout,
        cwd=args.code,
    ) as (url, process):
        plan = run_async(process_plan(url))
        print(f"  plan {plan} ({logged_plan(log_path)})", flush=True)
        result = run_async(measure_shape(args, url, process.pid))
    document = {
        "kind": "scaling",
        "machine": {**facts, "load_average": list(os.getloadavg())},
        "started_at": started_at,
        "shape": shape,
        "plan": plan,
        "plan_logged": logged_plan(log_path),
        "code": revision(args.code or REPO_ROOT),
        "config": {key: value for key, value in vars(args).items() if key not in ("shapes", "mix")}
        | {"mix": args.mix, "server_env": env},
        **result,
    }
    return write_json(args.results_dir / f"{name}.json", document)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shapes", nargs="+", type=parse_shape, metavar="NAME:SERVER:CLIENT")
    parser.add_argument("--model", default="build/onnx/default", help="MT_EXPORTS")
    parser.add_argument("--duration", type=float, default=30.0, help="s per load point")
    parser.add_argument("--capacity-duration", type=float, default=20.0)
    parser.add_argument("--capacity", type=float, help="req/s: skip the closed loop")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--warmup", type=float, default=5.0, help="s of unmeasured load first")
    parser.add_argument(
        "--loads", type=_int_list, default=[50, 85, 95], help="%% of capacity (default 50,85,95)"
    )
    parser.add_argument("--project-cores", type=_int_list, default=[4, 8, 16])
    parser.add_argument("--mix", type=parse_weights, default={"ui": 0.8, "help": 0.2})
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-in-flight", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, s")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--code",
        type=Path,
        metavar="DIR",
        help="serve from this checkout (e.g. `git worktree add DIR main`: old against new)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR / "scaling")
    return parser


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want integers like 50,85,95, not {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    facts = machine()  # before pinning: the whole machine's CPUs
    paths = [run_shape(args, shape, facts) for shape in args.shapes]
    for path in paths:
        print(f"wrote {path}")
    print(f"wrote {write_summary(args.results_dir, paths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
