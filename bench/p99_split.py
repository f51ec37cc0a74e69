"""Why a closed loop's p99 spreads from its p50: queue wait against time in the batch, and
latency by output length, one-process service on one core.

    .venv/bin/python -m bench.p99_split [--model build/onnx/default] [--duration 30]

The service runs under ``taskset -c --server-cpus``; ``--concurrency`` closed-loop clients,
pinned to ``--client-cpus``, send held-out interface strings (bench/heldout, one a request)
to ``/v1/translate``. From the requests: latency p50/p90/p99, and the same by output length
(terciles of generated tokens, from each answer's ``usage``), and how many of the slowest 1 %
are in the longest tercile. From the server's ``/metrics`` over the window: the quantiles of
``mt_queue_wait_seconds`` (a sentence's wait before it joins the running batch) beside those
of ``mt_request_duration_seconds``, and the mean rows per decoder step. If the tail is the
queue, the spread is admission's; if it is the longest outputs, it is the decode itself (a
request is in the batch for as many steps as it has tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def quantile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def histogram_quantile(buckets: list[tuple[float, float]], fraction: float) -> float | None:
    """A quantile from cumulative ``(upper bound, count)`` buckets, linear within a bucket
    (as Prometheus' ``histogram_quantile``)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = fraction * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= target:
            if bound == float("inf"):
                return lower_bound
            share = (target - lower_count) / (count - lower_count) if count > lower_count else 1
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def bucket_delta(
    before: dict, after: dict, name: str, match: dict[str, str]
) -> list[tuple[float, float]]:
    """Cumulative buckets of ``name`` over the window, summed over series matching ``match``."""
    totals: dict[float, float] = {}
    for (metric, labels), value in after.items():
        if metric != f"{name}_bucket":
            continue
        found = dict(labels)
        if any(found.get(k) != v for k, v in match.items()):
            continue
        bound = float(found["le"])
        totals[bound] = totals.get(bound, 0.0) + value - before.get((metric, labels), 0.0)
    return sorted(totals.items())


def split(records: list[Any]) -> dict[str, Any]:
    ok = [r for r in records if r.ok and r.latency_s is not None]
    latencies = [r.latency_s * 1000 for r in ok]
    tokens = sorted(r.output_tokens or 0 for r in ok)
    cuts = [quantile(tokens, 1 / 3) or 0, quantile(tokens, 2 / 3) or 0]

    def tercile(r: Any) -> int:
        return sum((r.output_tokens or 0) > cut for cut in cuts)

    by_length = {}
    for index, name in enumerate(("short", "middle", "long")):
        group = [r.latency_s * 1000 for r in ok if tercile(r) == index]
        members = [r.output_tokens or 0 for r in ok if tercile(r) == index]
        by_length[name] = {
            "requests": len(group),
            "mean_tokens": round(sum(members) / len(members), 1) if members else None,
            "p50_ms": round(quantile(group, 0.5) or 0, 1),
            "p99_ms": round(quantile(group, 0.99) or 0, 1),
        }
    slowest = sorted(ok, key=lambda r: r.latency_s)[-max(1, len(ok) // 100) :]
    return {
        "requests": len(ok),
        "latency_ms": {
            f"p{int(q * 100)}": round(quantile(latencies, q) or 0, 1) for q in (0.5, 0.9, 0.99)
        },
        "output_tokens_terciles": cuts,
        "by_output_length": by_length,
        "slowest_1pct_in_longest_tercile": sum(tercile(r) == 2 for r in slowest),
        "slowest_1pct": len(slowest),
    }


def main(argv: list[str] | None = None) -> int:
    from bench.request_stages import HeldoutSampler
    from loadtest.client import run_async, scrape_metrics, spawned_process
    from loadtest.closed_loop import run_closed_loop
    from loadtest.machine import machine_facts
    from loadtest.raw_http import RawClients

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="build/onnx/default")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("bench/results/p99_split.json"))
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    command = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "service"]
    command += ["--host", "127.0.0.1", "--port", "{port}"]
    env = {"MT_PROCESS_MODE": "single", **dict(p.split("=", 1) for p in args.server_env)}

    async def window(url: str, seconds: float, seed: int) -> tuple[list[Any], Any, Any]:
        async with RawClients(args.concurrency + 2, 120.0) as client:
            before = await scrape_metrics(client, url)  # type: ignore[arg-type]
            records = await run_closed_loop(
                client,  # type: ignore[arg-type]
                url,
                HeldoutSampler(seed),  # type: ignore[arg-type]
                concurrency=args.concurrency,
                duration_s=seconds,
            )
            after = await scrape_metrics(client, url)  # type: ignore[arg-type]
        return records, before or {}, after or {}

    with spawned_process(args.model, command=command, extra_env=env) as (url, _process):
        run_async(window(url, args.warmup, 1000))
        records, before, after = run_async(window(url, args.duration, 0))
    result: dict[str, Any] = {"requests": split(records), "machine": machine_facts()}
    metrics: dict[str, Any] = {}
    for label, name, match in (
        ("request", "mt_request_duration_seconds", {"route": "/v1/translate"}),
        ("queue_wait", "mt_queue_wait_seconds", {}),
    ):
        buckets = bucket_delta(before, after, name, match)
        metrics[label] = {
            f"p{int(q * 100)}_ms": round(1000 * (histogram_quantile(buckets, q) or 0), 1)
            for q in (0.5, 0.9, 0.99)
        }
    total = [v for (k, _), v in after.items() if k == "mt_batch_rows_sum"]
    count = [v for (k, _), v in after.items() if k == "mt_batch_rows_count"]
    before_sum = sum(v for (k, _), v in before.items() if k == "mt_batch_rows_sum")
    before_count = sum(v for (k, _), v in before.items() if k == "mt_batch_rows_count")
    steps = sum(count) - before_count
    metrics["rows_per_step"] = round((sum(total) - before_sum) / steps, 2) if steps else None
    metrics["steps"] = steps
    # Per serving thread over the window: CPU, and time runnable but waiting for the core
    # (on one core the event loop and the engine thread queue behind each other).
    for family in ("mt_thread_cpu_seconds", "mt_thread_runqueue_seconds"):
        metrics[family] = {
            dict(labels).get("thread", "?"): round(value - before.get((name, labels), 0.0), 3)
            for (name, labels), value in after.items()
            if name in (family, f"{family}_total")
        }
    # Why the head of the queue was kept waiting, by reason (the scheduler's counters).
    metrics["deferrals"] = {
        dict(labels).get("reason", "all"): value - before.get((name, labels), 0.0)
        for (name, labels), value in after.items()
        if name == "mt_admission_deferrals_total"
    }
    result["metrics"] = metrics
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["requests"], indent=2))
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
