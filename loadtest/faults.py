"""Faults under load, each against a freshly spawned server, Poisson arrivals at
``--fraction`` x ``--capacity``:

* ``step-error``: ``loadtest.fault_server`` makes one decoder step raise (SIGUSR1). Only the
  requests with rows in that step fail (500 ``engine_failure``); the others are 200 and the
  service stays healthy.
* ``thread-death``: the engine thread dies (SIGUSR2). What it held fails at once (500), new
  requests get 503 with ``Retry-After``, and ``/health`` and ``/ready`` turn 503 so that an
  orchestrator restarts the process.
* ``sigterm``: ``python -m service`` gets SIGTERM mid-load. Requests sent before it finish
  (200); requests after it get 503 while it drains, or find the port closed; the process
  exits within ``MT_SHUTDOWN_GRACE_S``.

    .venv/bin/python -m loadtest faults --model-dir build/onnx/default --capacity 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.client import RESULTS_DIR, RequestRecord, run_async, spawned_process
from loadtest.inputs import DEFAULT_WEIGHTS, InputSampler
from loadtest.open_loop import poisson_schedule, run_open_loop
from loadtest.raw_http import RawClient
from loadtest.report import write_json

FAULT_SERVER = [sys.executable, "-m", "loadtest.fault_server", "--port", "{port}"]


def _statuses(records: Sequence[RequestRecord]) -> dict[str, int]:
    return dict(sorted(Counter(str(r.status) for r in records).items()))


async def _load_with_signal(
    url: str,
    pid: int,
    args: argparse.Namespace,
    signal_number: int,
    signal_at_s: float,
    duration_s: float,
) -> tuple[list[RequestRecord], float, list[tuple[float, int, int]]]:
    """Open-loop load; ``signal_number`` to ``pid`` at ``signal_at_s``; /health and /ready
    probed every 100 ms. Returns records, the signal's offset, probes (t, health, ready)."""
    sampler = InputSampler(seed=args.seed, weights=dict(DEFAULT_WEIGHTS))
    schedule = poisson_schedule(args.fraction * args.capacity, duration_s=duration_s, seed=1)
    probes: list[tuple[float, int, int]] = []
    start = time.perf_counter()
    sent_at: list[float] = []

    async with RawClient(url, 512, 60.0) as client:

        async def send_signal() -> None:
            await asyncio.sleep(signal_at_s)
            sent_at.append(time.perf_counter() - start)
            os.kill(pid, signal_number)

        async def probe() -> None:
            while time.perf_counter() - start < duration_s + 2:
                statuses = []
                for path in ("/health", "/ready"):
                    try:
                        statuses.append((await client.get(url + path, timeout=5)).status_code)
                    except Exception:
                        statuses.append(0)
                probes.append((round(time.perf_counter() - start, 2), *statuses))
                await asyncio.sleep(0.1)

        signaller = asyncio.create_task(send_signal())
        prober = asyncio.create_task(probe())
        records = await run_open_loop(client, url, schedule, sampler, max_in_flight=512)
        await signaller
        await prober
    return records, sent_at[0], probes


def step_error(args: argparse.Namespace) -> dict[str, Any]:
    with spawned_process(args.model_dir, command=FAULT_SERVER) as (url, process):
        records, at, probes = run_async(
            _load_with_signal(url, process.pid, args, signal.SIGUSR1, 3.0, 8.0)
        )
    failed = [r for r in records if r.status == 500]
    return {
        "by_status": _statuses(records),
        "failed_codes": dict(Counter((r.error or "")[:80] for r in failed)),
        "failed_sent_s": [round(r.sent_s or 0, 2) for r in failed],
        "signal_at_s": round(at, 2),
        "health_after": probes[-1][1:],
        "verdict": bool(failed)
        and all("engine_failure" in (r.error or "") for r in failed)
        and set(_statuses(records)) <= {"200", "500"}
        and probes[-1][1:] == (200, 200),
    }


def thread_death(args: argparse.Namespace) -> dict[str, Any]:
    with spawned_process(args.model_dir, command=FAULT_SERVER) as (url, process):
        records, at, probes = run_async(
            _load_with_signal(url, process.pid, args, signal.SIGUSR2, 2.0, 6.0)
        )
    unhealthy_at = next((t for t, health, _ in probes if health == 503), None)
    after = [r for r in records if (r.sent_s or 0) > at + 0.5]
    return {
        "by_status": _statuses(records),
        "after_death_by_status": _statuses(after),
        "after_death_without_retry_after": sum(
            1 for r in after if r.status == 503 and r.retry_after_s is None
        ),
        "signal_at_s": round(at, 2),
        "health_503_after_s": None if unhealthy_at is None else round(unhealthy_at - at, 2),
        "last_probe": probes[-1],
        "verdict": unhealthy_at is not None
        and probes[-1][1:] == (503, 503)
        and set(_statuses(after)) == {"503"},
    }


def sigterm(args: argparse.Namespace) -> dict[str, Any]:
    grace = float(os.environ.get("MT_SHUTDOWN_GRACE_S", "30"))
    with spawned_process(args.model_dir) as (url, process):
        records, at, _ = run_async(
            _load_with_signal(url, process.pid, args, signal.SIGTERM, 4.0, 10.0)
        )
        started = time.monotonic()
        process.wait(timeout=grace + 30)
        exited_after = time.monotonic() - started
    before = [r for r in records if r.sent_s is not None and r.sent_s < at]
    after = [r for r in records if r.sent_s is not None and r.sent_s >= at]
    # Exit time: from the signal, the load ran on for (10 - at) s before we waited.
    exit_s = round(10.0 - at + exited_after, 2)
    return {
        "signal_at_s": round(at, 2),
        "sent_before_sigterm": _statuses(before),
        "sent_after_sigterm": _statuses(after),
        "after_503_without_retry_after": sum(
            1 for r in after if r.status == 503 and r.retry_after_s is None
        ),
        "exit_within_s": exit_s,
        "grace_s": grace,
        "verdict": set(_statuses(before)) == {"200"}
        and set(_statuses(after)) <= {"503", "0"}
        and exit_s <= grace,
    }


SCENARIOS = {"step-error": step_error, "thread-death": thread_death, "sigterm": sigterm}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--capacity", type=float, required=True, help="measured req/s")
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="faults")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    results = {}
    for name in args.only or list(SCENARIOS):
        print(f"{name} ...", flush=True)
        results[name] = SCENARIOS[name](args)
        print(f"{name}: {results[name]}", flush=True)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.results_dir / f"{args.name}.json", {"kind": "faults", "results": results})
    return 0 if all(result["verdict"] for result in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
