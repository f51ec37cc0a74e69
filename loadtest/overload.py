"""Overload: open-loop arrivals at a multiple of the measured capacity, and what the service
does about it.

Phases, one run:

1. **capacity**: closed loop, ``--capacity-clients`` clients for ``--capacity-duration`` s;
   its throughput is the capacity (or give ``--capacity`` to skip this phase);
2. **normal**: ``--probe-requests`` requests one after another (fixed texts): the normal
   latency of a lone request;
3. **storm**: Poisson arrivals at ``--factor`` x capacity for ``--duration`` s, while
   ``/health`` and ``/metrics`` are probed every ``--probe-interval`` s, the server's RSS and
   open fds are sampled, and CPU time per server thread is read before and after (the event
   loop's share against the engine's);
4. **after**: once the storm's requests have all returned, the same lone requests again.

Verdicts printed and saved (``loadtest/results/NAME.json``): every answer 200, 429 or 503,
every 429/503 with ``Retry-After``; rejections' p99 within ``--reject-p99-ms``; accepted
requests within their timeout; probes' p99 within ``--probe-p99-ms``; the first request after
the storm within ``--after-factor`` x the normal one.

    .venv/bin/python -m loadtest overload --spawn-server build/onnx/default --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from loadtest.client import (
    DEFAULT_URL,
    RESULTS_DIR,
    STATUS_DROPPED,
    RequestRecord,
    check_target,
    parse_env_pairs,
    run_async,
    scrape_metrics,
    send_translate,
    spawned_process,
)
from loadtest.closed_loop import run_closed_loop
from loadtest.inputs import DEFAULT_WEIGHTS, InputSampler
from loadtest.open_loop import poisson_schedule, run_open_loop
from loadtest.process_stats import ProcessSampler, cpu_split, thread_cpu_seconds
from loadtest.raw_http import RawClient
from loadtest.report import latency_summary_ms, measurement_window, percentile, write_json

PROBE_TEXTS = ("Save changes", "The file could not be opened because it is read-only.")
PROBE_PATHS = ("/health", "/metrics")


async def lone_requests(client: RawClient, url: str, count: int) -> list[float]:
    """Latencies (ms) of ``count`` requests sent one after another."""
    latencies = []
    for index in range(count):
        record = RequestRecord(index=index, scheduled_s=0.0)
        start = time.perf_counter()
        payload = {"text": PROBE_TEXTS[index % len(PROBE_TEXTS)]}
        await send_translate(client, url, payload, record, start)
        latencies.append((time.perf_counter() - start) * 1000)
        if record.status != 200:
            raise RuntimeError(f"a lone request failed with {record.status}: {record.error}")
    return latencies


async def probe(
    client: RawClient, url: str, interval_s: float, stop: asyncio.Event
) -> dict[str, list[tuple[int, float]]]:
    """GET each of PROBE_PATHS every ``interval_s`` (each probe its own task, so a slow one
    does not delay the next); (status, ms) per probe, measured from its scheduled time."""
    results: dict[str, list[tuple[int, float]]] = {path: [] for path in PROBE_PATHS}
    tasks = set()

    async def one(path: str, scheduled: float) -> None:
        try:
            response = await client.get(url + path, timeout=30.0)
            status = response.status_code
        except httpx.HTTPError:
            status = 0
        results[path].append((status, (time.perf_counter() - scheduled) * 1000))

    next_at = time.perf_counter()
    while not stop.is_set():
        for path in PROBE_PATHS:
            task = asyncio.create_task(one(path, next_at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    if tasks:
        await asyncio.gather(*tasks)
    return results


def storm_summary(
    records: Sequence[RequestRecord], timeout_s: float, window_s: float
) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for record in records:
        statuses[str(record.status)] = statuses.get(str(record.status), 0) + 1
    accepted = [r.latency_s * 1000 for r in records if r.status == 200 and r.latency_s]
    rejected = [r for r in records if r.status in (429, 503)]
    rejected_ms = [r.latency_s * 1000 for r in rejected if r.latency_s is not None]
    unexpected = {
        status: count for status, count in statuses.items() if status not in ("200", "429", "503")
    }
    return {
        "requests": len(records),
        "by_status": dict(sorted(statuses.items())),
        "unexpected_statuses": unexpected,
        "dropped_by_sender": sum(1 for r in records if r.status == STATUS_DROPPED),
        "rejections_without_retry_after": sum(1 for r in rejected if r.retry_after_s is None),
        "accepted_rps": round(len(accepted) / window_s, 2) if window_s else None,
        "accepted_latency_ms": latency_summary_ms([a / 1000 for a in accepted]),
        "accepted_over_timeout": sum(1 for a in accepted if a > timeout_s * 1000),
        "rejection_latency_ms": latency_summary_ms([r / 1000 for r in rejected_ms]),
    }


def probe_summary(results: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    summary = {}
    for path, samples in results.items():
        latencies = [ms for _, ms in samples]
        summary[path] = {
            "probes": len(samples),
            "not_200": sum(1 for status, _ in samples if status != 200),
            "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "max_ms": round(max(latencies), 1) if latencies else None,
        }
    return summary


async def run_overload(args: argparse.Namespace, url: str, pid: int | None) -> dict[str, Any]:
    sampler = InputSampler(seed=args.seed, weights=dict(DEFAULT_WEIGHTS))
    result: dict[str, Any] = {}
    async with RawClient(url, args.max_in_flight + 8, args.timeout) as client:
        capacity = args.capacity
        if capacity is None:
            print(f"capacity: {args.capacity_clients} closed-loop clients ...", flush=True)
            records = await run_closed_loop(
                client,
                url,
                sampler,
                concurrency=args.capacity_clients,
                duration_s=args.capacity_duration,
            )
            window = measurement_window(records, 0.0)
            capacity = sum(1 for r in records if r.ok) / window
            result["capacity_phase"] = {
                "clients": args.capacity_clients,
                "duration_s": round(window, 1),
                "ok": sum(1 for r in records if r.ok),
                "not_ok": sum(1 for r in records if not r.ok),
            }
        result["capacity_rps"] = round(capacity, 2)
        rate = args.factor * capacity
        print(f"capacity {capacity:.1f} req/s; storm at {rate:.1f} req/s", flush=True)

        normal = await lone_requests(client, url, args.probe_requests)
        result["normal_ms"] = latency_summary_ms([n / 1000 for n in normal])

        schedule = poisson_schedule(rate, duration_s=args.duration, seed=args.seed + 1)
        stop = asyncio.Event()
        process = ProcessSampler(pid, interval_s=1.0) if pid else None
        cpu_before = thread_cpu_seconds(pid) if pid else {}
        probes = asyncio.create_task(probe(client, url, args.probe_interval, stop))
        sampling = asyncio.create_task(process.run(stop)) if process else None
        started = time.perf_counter()
        records = await run_open_loop(
            client, url, schedule, sampler, max_in_flight=args.max_in_flight
        )
        storm_s = time.perf_counter() - started
        cpu_after = thread_cpu_seconds(pid) if pid else {}
        stop.set()
        probe_results = await probes
        if sampling:
            await sampling
        result["storm"] = {
            "rate_rps": round(rate, 2),
            "duration_s": args.duration,
            "wall_s": round(storm_s, 1),
            **storm_summary(records, args.request_timeout, args.duration),
        }
        result["probes"] = probe_summary(probe_results)
        result["process"] = process.summary() if process else {"available": False}
        result["cpu"] = cpu_split(pid, cpu_before, cpu_after) if pid else None
        metrics = await scrape_metrics(client, url)
        if metrics:
            result["server_rejections"] = {
                dict(labels).get("reason", ""): value
                for (name, labels), value in metrics.items()
                if name == "mt_rejections_total"
            }

        after = await lone_requests(client, url, args.probe_requests)
        result["after_ms"] = latency_summary_ms([a / 1000 for a in after])
        result["first_after_ms"] = round(after[0], 1)
        result["records"] = [r.as_dict() for r in records]
    return result


def verdicts(result: dict[str, Any], args: argparse.Namespace) -> dict[str, bool]:
    storm = result["storm"]
    probes = result["probes"]
    process = result["process"]
    verdict = {
        "only_200_429_503": not storm["unexpected_statuses"] and storm["dropped_by_sender"] == 0,
        "every_rejection_has_retry_after": storm["rejections_without_retry_after"] == 0,
        "rejections_p99_within_limit": (storm["rejection_latency_ms"]["p99"] or 0)
        <= args.reject_p99_ms,
        "accepted_within_timeout": storm["accepted_over_timeout"] == 0,
        "probes_p99_within_limit": all(
            (p["p99_ms"] or 0) <= args.probe_p99_ms and p["not_200"] == 0 for p in probes.values()
        ),
        "first_request_after_is_normal": result["first_after_ms"]
        <= args.after_factor * max(result["normal_ms"]["max"] or 0, 1.0),
    }
    if process.get("available"):
        verdict["memory_bounded"] = process["rss_mb_last"] <= 1.5 * process["rss_mb_first"]
    return verdict


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest overload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--pid", type=int, help="server pid for RSS/fds/CPU (with --url)")
    parser.add_argument("--spawn-server", metavar="MODEL_DIR")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--allow-remote", action="store_true")
    parser.add_argument("--capacity", type=float, help="req/s; skips the capacity phase")
    parser.add_argument("--capacity-clients", type=int, default=32)
    parser.add_argument("--capacity-duration", type=float, default=20.0)
    parser.add_argument("--factor", type=float, default=3.0, help="storm rate / capacity")
    parser.add_argument("--duration", type=float, default=60.0, help="storm seconds")
    parser.add_argument("--max-in-flight", type=int, default=1024, help="sender's cap")
    parser.add_argument("--timeout", type=float, default=90.0, help="client timeout, s")
    parser.add_argument(
        "--request-timeout", type=float, default=60.0, help="the server's MT_REQUEST_TIMEOUT_S"
    )
    parser.add_argument("--probe-interval", type=float, default=0.1)
    parser.add_argument("--probe-requests", type=int, default=5)
    parser.add_argument("--reject-p99-ms", type=float, default=250.0)
    parser.add_argument("--probe-p99-ms", type=float, default=500.0)
    parser.add_argument("--after-factor", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="overload")
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
            result = run_async(run_overload(args, url, process.pid))
    else:
        check_target(args.url, args.allow_remote)
        url = args.url
        result = run_async(run_overload(args, url, args.pid))
    result["verdicts"] = verdicts(result, args)
    records = result.pop("records")
    print(format_result(result))
    write_json(
        args.results_dir / f"{args.name}.json",
        {"kind": "overload", "url": url, "started_at": started_at, "config": vars(args)}
        | result
        | {"records": records},
    )
    return 0 if all(result["verdicts"].values()) else 1


def format_result(result: dict[str, Any]) -> str:
    storm = result["storm"]
    lines = [
        f"capacity {result['capacity_rps']} req/s; storm {storm['rate_rps']} req/s for "
        f"{storm['duration_s']} s ({storm['requests']} arrivals)",
        f"by status {storm['by_status']}  without Retry-After "
        f"{storm['rejections_without_retry_after']}",
        "rejections ms  " + "  ".join(f"{k} {v}" for k, v in storm["rejection_latency_ms"].items()),
        "accepted ms    "
        + "  ".join(f"{k} {v}" for k, v in storm["accepted_latency_ms"].items())
        + f"  ({storm['accepted_rps']} req/s, {storm['accepted_over_timeout']} over timeout)",
    ]
    for path, probe_result in result["probes"].items():
        lines.append(f"{path:<9} {probe_result}")
    lines.append(f"process {result['process']}")
    lines.append(f"cpu {result['cpu']}")
    lines.append(
        f"lone request ms: normal {result['normal_ms']['p50']}, first after "
        f"{result['first_after_ms']}"
    )
    lines.append("verdicts " + "  ".join(f"{k}={v}" for k, v in result["verdicts"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
