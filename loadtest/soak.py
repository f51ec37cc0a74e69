"""Soak: a long open-loop run at a fraction of capacity, watching for leaks.

Poisson arrivals at ``--fraction`` x ``--capacity`` req/s for ``--duration`` s (default 10
minutes at 75 %), with the server's RSS and open file descriptors sampled every
``--sample-interval`` s. Reports errors (goal: none), RSS growth from the end of the first
minute (warm-up: allocator pools, caches of ONNX Runtime) to the end (goal: < 5 %), and
descriptors at the start and end (goal: flat).

RSS swings with the batch mix (a sample can catch a high or a low), so growth is given two
ways: the last sample against the one at the end of warm-up, and the median of the last
minute against the median of the minute after warm-up (less sensitive to one sample).

    .venv/bin/python -m loadtest soak --spawn-server build/onnx/default --capacity 64
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.client import (
    DEFAULT_URL,
    RESULTS_DIR,
    check_target,
    parse_env_pairs,
    run_async,
    spawned_process,
)
from loadtest.inputs import DEFAULT_WEIGHTS, InputSampler
from loadtest.open_loop import poisson_schedule, run_open_loop
from loadtest.process_stats import ProcessSampler, open_fds
from loadtest.raw_http import RawClient
from loadtest.report import latency_summary_ms, write_json

# A bound on one run's arrivals all the same (10 minutes at 75 % of ~65 req/s is ~29,000).
SOAK_MAX_REQUESTS = 60_000


def median_rss_growth_pct(
    samples: Sequence[dict[str, Any]], warmup_s: float, window_s: float = 60.0
) -> float | None:
    """Median RSS over the last ``window_s`` against the median over the ``window_s`` after
    warm-up, in percent; None if the run is too short for two separate windows."""
    end = samples[-1]["t_s"] if samples else 0.0
    if end - warmup_s < 2 * window_s:
        return None
    first = [s["rss_mb"] for s in samples if warmup_s <= s["t_s"] < warmup_s + window_s]
    last = [s["rss_mb"] for s in samples if s["t_s"] > end - window_s]
    first, last = [v for v in first if v], [v for v in last if v]
    if not first or not last:
        return None
    before, after = statistics.median(first), statistics.median(last)
    return round(100 * (after - before) / before, 2)


async def run_soak(args: argparse.Namespace, url: str, pid: int | None) -> dict[str, Any]:
    rate = args.fraction * args.capacity
    sampler = InputSampler(seed=args.seed, weights=dict(DEFAULT_WEIGHTS))
    schedule = poisson_schedule(
        rate, duration_s=args.duration, seed=args.seed, max_requests=SOAK_MAX_REQUESTS
    )
    process = ProcessSampler(pid, interval_s=args.sample_interval) if pid else None
    stop = asyncio.Event()
    async with RawClient(url, args.max_in_flight + 4, args.timeout) as client:
        sampling = asyncio.create_task(process.run(stop)) if process else None
        records = await run_open_loop(
            client, url, schedule, sampler, max_in_flight=args.max_in_flight
        )
        stop.set()
        if sampling:
            await sampling
    # The load's own connections are closed now: what stays open is the server's.
    await asyncio.sleep(2.0)
    fds_after_close = open_fds(pid) if pid else None
    statuses: dict[str, int] = {}
    for record in records:
        statuses[str(record.status)] = statuses.get(str(record.status), 0) + 1
    result: dict[str, Any] = {
        "rate_rps": round(rate, 2),
        "duration_s": args.duration,
        "schedule_s": round(schedule[-1], 1) if schedule else 0.0,
        "requests": len(records),
        "by_status": dict(sorted(statuses.items())),
        "errors": sum(1 for r in records if r.status != 200),
        "latency_ms": latency_summary_ms([r.latency_s for r in records if r.ok and r.latency_s]),
    }
    if process and process.samples:
        samples = process.samples
        warm = next((s for s in samples if s["t_s"] >= args.warmup), samples[0])
        last = samples[-1]
        result["memory"] = {
            "rss_mb_start": samples[0]["rss_mb"],
            "rss_mb_after_warmup": warm["rss_mb"],
            "rss_mb_end": last["rss_mb"],
            "rss_mb_peak": max(s["rss_mb"] or 0 for s in samples),
            "rss_growth_after_warmup_pct": round(
                100 * (last["rss_mb"] - warm["rss_mb"]) / warm["rss_mb"], 2
            )
            if warm["rss_mb"] and last["rss_mb"]
            else None,
            "rss_growth_median_last_vs_first_minute_pct": median_rss_growth_pct(
                samples, args.warmup
            ),
            "fds_start": samples[0]["fds"],
            "fds_after_warmup": warm["fds"],
            "fds_end": last["fds"],
            "fds_peak": max(s["fds"] or 0 for s in samples),
            "fds_after_load_closed": fds_after_close,
        }
        result["samples"] = samples
    result["records"] = [r.as_dict() for r in records]
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--pid", type=int, help="server pid for RSS/fds (with --url)")
    parser.add_argument("--spawn-server", metavar="MODEL_DIR")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--allow-remote", action="store_true")
    parser.add_argument("--capacity", type=float, required=True, help="measured req/s")
    parser.add_argument("--fraction", type=float, default=0.75)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=60.0, help="s before RSS is compared")
    parser.add_argument("--sample-interval", type=float, default=5.0)
    parser.add_argument("--max-in-flight", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="soak")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if args.spawn_server:
        log_path = args.results_dir / f"{args.name}.server.log"
        with spawned_process(
            args.spawn_server, extra_env=parse_env_pairs(args.server_env), log_path=log_path
        ) as (url, process):
            result = run_async(run_soak(args, url, process.pid))
    else:
        check_target(args.url, args.allow_remote)
        url = args.url
        result = run_async(run_soak(args, url, args.pid))
    records = result.pop("records")
    samples = result.pop("samples", [])
    print(
        f"soak {result['rate_rps']} req/s for {result['duration_s']:g} s: {result['requests']} "
        f"requests, by status {result['by_status']}, errors {result['errors']}"
    )
    print("latency ms " + "  ".join(f"{k} {v}" for k, v in result["latency_ms"].items()))
    print(f"memory/fds {result.get('memory')}")
    write_json(
        args.results_dir / f"{args.name}.json",
        {"kind": "soak", "url": url, "started_at": started_at, "config": vars(args)}
        | result
        | {"samples": samples, "records": records},
    )
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
