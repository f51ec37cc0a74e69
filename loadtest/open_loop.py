"""Open-loop load: Poisson arrivals at a fixed rate, independent of the responses.

The sender walks a precomputed arrival schedule and starts each request at its scheduled
time without waiting for earlier ones to return, the way independent users arrive at a real
service. Latency is measured from the *scheduled* time, so a slow service (or a lagging
sender) cannot hide queueing by slowing the arrivals down (no coordinated omission).

At most ``--max-in-flight`` requests are outstanding; an arrival that finds the cap full is not
sent and is recorded as dropped (it counts as a failure). The default is above the service's own
in-flight limit (``MT_MAX_INFLIGHT_REQUESTS``'s default; a test keeps it so), so under overload
the service's admission control, not the generator, decides who is refused (429 with
Retry-After, counted as such); a cap below it hid queued requests' latency and counted nothing
as shed.

    .venv/bin/python -m loadtest.open_loop --rate 2 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from loadtest.client import (
    STATUS_DROPPED,
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
from loadtest.report import (
    format_summary,
    measurement_window,
    save_run,
    summarize,
    timeline_point,
)

DEFAULT_RATE = 2.0
DEFAULT_DURATION_S = 30.0
DEFAULT_MAX_IN_FLIGHT = 512  # above the service's in-flight limit: module docstring
# Never more arrivals than this in one run, whatever rate x duration says.
MAX_REQUESTS_PER_RUN = 20_000


def poisson_schedule(
    rate: float,
    *,
    duration_s: float | None = None,
    count: int | None = None,
    seed: int = 0,
    max_requests: int = MAX_REQUESTS_PER_RUN,
) -> list[float]:
    """Arrival offsets (s) of a Poisson process at ``rate``/s: exponential inter-arrival
    times with mean 1/rate. Stops at ``duration_s`` or after ``count`` arrivals, whichever
    comes first (at least one of them is required), and never beyond ``max_requests``
    (MAX_REQUESTS_PER_RUN unless a script such as the soak raises it)."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    if duration_s is None and count is None:
        raise ValueError("give a duration, a count, or both")
    limit = min(count if count is not None else max_requests, max_requests)
    rng = random.Random(seed)
    offsets: list[float] = []
    now = 0.0
    while len(offsets) < limit:
        now += rng.expovariate(rate)
        if duration_s is not None and now > duration_s:
            break
        offsets.append(now)
    return offsets


async def run_open_loop(
    client: httpx.AsyncClient,
    url: str,
    schedule: Sequence[float],
    sampler: InputSampler,
    *,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    clock: Callable[[], float] = time.perf_counter,
) -> list[RequestRecord]:
    """Send one request per schedule offset; return the records in schedule order.

    The sender only ever sleeps until the next arrival; responses are awaited by their own
    tasks. The in-flight count rises when a request's task is created, so the cap holds even
    when many arrivals fall due at once.
    """
    start = clock()
    records: list[RequestRecord] = []
    tasks: set[asyncio.Task[RequestRecord]] = set()
    in_flight = 0

    def finished(task: asyncio.Task[RequestRecord]) -> None:
        nonlocal in_flight
        in_flight -= 1
        tasks.discard(task)

    for index, offset in enumerate(schedule):
        delay = start + offset - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        record = RequestRecord(index=index, scheduled_s=offset)
        records.append(record)
        payload = sampler.next_payload()  # drawn for drops too: the input sequence stays fixed
        if in_flight >= max_in_flight:
            record.status = STATUS_DROPPED
            record.error = f"not sent: {max_in_flight} requests already in flight"
            continue
        in_flight += 1
        task = asyncio.create_task(send_translate(client, url, payload, record, start))
        tasks.add(task)
        task.add_done_callback(finished)
    if tasks:
        # Every request has the client's timeout, so this ends by itself.
        await asyncio.gather(*tasks)
    return records


async def measure_open_loop(
    url: str,
    rate: float,
    sampler: InputSampler,
    *,
    duration_s: float | None,
    count: int | None,
    seed: int,
    max_in_flight: int,
    timeout_s: float,
    sample_every_s: float | None = None,
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """One open-loop run with /metrics scraped before and after (and every
    ``sample_every_s`` seconds meanwhile: ``summary["timeline"]``); returns records and
    summary."""
    schedule = poisson_schedule(rate, duration_s=duration_s, count=count, seed=seed)
    async with make_client(max_in_flight + 2, timeout_s) as client:
        before = await scrape_metrics(client, url)
        timeline: list[dict[str, float | None]] = []
        sampling = (
            asyncio.create_task(sample_timeline(client, url, timeline, sample_every_s))
            if sample_every_s
            else None
        )
        try:
            records = await run_open_loop(
                client, url, schedule, sampler, max_in_flight=max_in_flight
            )
        finally:
            if sampling is not None:
                sampling.cancel()
        after = await scrape_metrics(client, url)
    schedule_end = duration_s if duration_s is not None else (schedule[-1] if schedule else 0.0)
    window = measurement_window(records, schedule_end)
    summary = summarize(records, duration_s=window, metrics_before=before, metrics_after=after)
    if timeline:
        summary["timeline"] = timeline
    return records, summary


async def sample_timeline(
    client: httpx.AsyncClient, url: str, timeline: list[dict[str, float | None]], every_s: float
) -> None:
    """Scrape /metrics every ``every_s`` seconds until cancelled: how queue, batch, knee and
    engine busy share move during the run (a collapse shows in time, not in a percentile)."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        samples = await scrape_metrics(client, url)
        if samples is not None:
            timeline.append(timeline_point(time.monotonic() - started, samples))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.open_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help="arrivals per second (default %(default)s)"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds of arrivals (default {DEFAULT_DURATION_S:g} unless --requests)",
    )
    parser.add_argument("--requests", type=int, default=None, help="number of arrivals")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help="outstanding-request cap; beyond it arrivals are dropped",
    )
    add_common_arguments(parser, default_name="open_loop")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    duration = (
        args.duration
        if args.duration is not None or args.requests is not None
        else DEFAULT_DURATION_S
    )
    sampler = sampler_from_args(args)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with target_url(args) as url:
        print(f"open loop: {args.rate:g} req/s Poisson against {url}", flush=True)
        records, summary = run_async(
            measure_open_loop(
                url,
                args.rate,
                sampler,
                duration_s=duration,
                count=args.requests,
                seed=args.seed,
                max_in_flight=args.max_in_flight,
                timeout_s=args.timeout,
            )
        )
    print(format_summary(summary))
    document = {
        "kind": "open_loop",
        "url": url,
        "started_at": started_at,
        "config": {
            "rate": args.rate,
            "duration_s": duration,
            "requests": args.requests,
            "max_in_flight": args.max_in_flight,
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
        f"open loop, {args.rate:g} req/s Poisson",
        plot=not args.no_plot,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
