"""Closed-loop load: N clients, each sending its next request when the previous one returns.

This measures what a fixed pool of callers (a batch job with N workers, a gateway with N
connections) gets: throughput at a given concurrency, and latency as each caller sees it.
Arrivals here depend on the responses, so this is the wrong tool for latency under a given
*arrival rate* — use ``loadtest.open_loop`` for that.

A client that gets 429/503 with ``Retry-After`` waits that long (at most 5 s) before its
next request, as a well-behaved caller would, instead of hammering the queue.

    .venv/bin/python -m loadtest.closed_loop --concurrency 4 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from loadtest.client import (
    STATUS_TRANSPORT_ERROR,
    RequestRecord,
    add_common_arguments,
    make_client,
    run_async,
    sampler_from_args,
    scrape_metrics,
    send_translate,
    target_url,
)
from loadtest.inputs import InputSampler
from loadtest.report import format_summary, measurement_window, save_run, summarize

DEFAULT_CONCURRENCY = 4
DEFAULT_DURATION_S = 30.0
MAX_RETRY_AFTER_S = 5.0
TRANSPORT_ERROR_PAUSE_S = 0.5
MAX_REQUESTS_PER_RUN = 20_000


async def run_closed_loop(
    client: httpx.AsyncClient,
    url: str,
    sampler: InputSampler,
    *,
    concurrency: int,
    duration_s: float | None = None,
    max_requests: int | None = None,
    honour_retry_after: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> list[RequestRecord]:
    """Run ``concurrency`` clients until ``duration_s`` has passed (no new request starts
    after it) or ``max_requests`` were sent; return the records in send order."""
    if duration_s is None and max_requests is None:
        raise ValueError("give a duration, a request count, or both")
    budget = min(
        max_requests if max_requests is not None else MAX_REQUESTS_PER_RUN, MAX_REQUESTS_PER_RUN
    )
    start = clock()
    deadline = start + duration_s if duration_s is not None else float("inf")
    indices = itertools.count()
    records: list[RequestRecord] = []

    async def one_client() -> None:
        while clock() < deadline:
            index = next(indices)
            if index >= budget:
                return
            # Closed loop: the request is "scheduled" the moment the client is free to send it.
            record = RequestRecord(index=index, scheduled_s=clock() - start)
            records.append(record)
            await send_translate(client, url, sampler.next_payload(), record, start)
            pause = 0.0
            if (
                honour_retry_after
                and record.retry_after_s is not None
                and record.status in (429, 503)
            ):
                pause = min(record.retry_after_s, MAX_RETRY_AFTER_S)
            elif record.status == STATUS_TRANSPORT_ERROR:
                pause = TRANSPORT_ERROR_PAUSE_S  # a refused connection fails at once: don't spin
            if pause > 0:
                await asyncio.sleep(min(pause, max(0.0, deadline - clock())))

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return sorted(records, key=lambda r: r.index)


async def measure_closed_loop(
    url: str,
    sampler: InputSampler,
    *,
    concurrency: int,
    duration_s: float | None,
    max_requests: int | None,
    timeout_s: float,
) -> tuple[list[RequestRecord], dict[str, Any]]:
    async with make_client(concurrency + 2, timeout_s) as client:
        before = await scrape_metrics(client, url)
        records = await run_closed_loop(
            client,
            url,
            sampler,
            concurrency=concurrency,
            duration_s=duration_s,
            max_requests=max_requests,
        )
        after = await scrape_metrics(client, url)
    window = measurement_window(records, 0.0)
    summary = summarize(records, duration_s=window, metrics_before=before, metrics_after=after)
    summary["concurrency"] = concurrency
    return records, summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.closed_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="clients (default %(default)s)"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds (default {DEFAULT_DURATION_S:g} unless --requests)",
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="total requests over all clients"
    )
    add_common_arguments(parser, default_name="closed_loop")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.concurrency < 1:
        raise SystemExit("--concurrency must be at least 1")
    duration = (
        args.duration
        if args.duration is not None or args.requests is not None
        else DEFAULT_DURATION_S
    )
    sampler = sampler_from_args(args)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with target_url(args) as url:
        print(f"closed loop: {args.concurrency} clients against {url}", flush=True)
        records, summary = run_async(
            measure_closed_loop(
                url,
                sampler,
                concurrency=args.concurrency,
                duration_s=duration,
                max_requests=args.requests,
                timeout_s=args.timeout,
            )
        )
    print(format_summary(summary))
    document = {
        "kind": "closed_loop",
        "url": url,
        "started_at": started_at,
        "config": {
            "concurrency": args.concurrency,
            "duration_s": duration,
            "requests": args.requests,
            "timeout_s": args.timeout,
            "spawned_server": args.spawn_server,
            "inputs": sampler.describe(),
        },
        "summary": summary,
        "records": [r.as_dict() for r in records],
    }
    save_run(
        args.results_dir,
        args.name,
        document,
        records,
        f"closed loop, {args.concurrency} clients",
        plot=not args.no_plot,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
