"""Continuous against static batching: the same open-loop load against the service twice.

The service is started on a free loopback port with ``MT_BATCHING=continuous``, loaded with
an open-loop Poisson schedule, stopped; then started again with ``MT_BATCHING=static`` (wait
up to ``--static-max-wait-ms`` for a full batch, run it to the end, like Triton's dynamic
batcher; see service/scheduling/batcher.py) and loaded with the *same* schedule and inputs (same seed,
rate, duration and mix of short UI strings and multi-sentence help paragraphs). Both runs
use the same model directory and ``--server-env`` settings; only the policy differs.

The report puts the two side by side, with static/continuous ratios: latency p50/p90/p99
(from the scheduled send time, 200s only), throughput (req/s, generated tokens/s), the
server's mean queue wait and mean rows per decoder step. It writes
``loadtest/results/compare-batching.json`` (config, both summaries and request records, the
table) and ``compare-batching.png`` (latency CDFs and percentile bars).

``--interleave K`` runs both services at once (each idle while the other is loaded) and cuts
the schedule into K segments of equal length; each segment goes to both policies, first to one
and then to the other, the order alternating (continuous first in even segments). A shared
VM's speed drifts by 10-20 % within minutes (BENCHMARKS.md): back to back, 40 s of one policy
and then 40 s of the other compare two different machines as much as two policies; interleaved,
the drift falls on both alike. Each policy still gets every arrival of the schedule, with the
same inputs in the same order; latency counts from the scheduled time within its segment, and
rates and the engine busy share divide by the sum of that policy's segment windows.

``--control`` adds a third service, a second static batcher (``control``), loaded like the
other two (interleaved: each segment goes to all three in turn, the order rotating). Its
ratios to ``static`` are an A/A comparison: how far two identical policies land apart in one
run on this machine, the yardstick for a continuous / static ratio of the same run.
``--control continuous`` makes it a second continuous batcher (ratios to ``continuous``), and
``--arm-env control:KEY=VALUE`` gives the control arm a setting of its own: an A/B of that
setting in the same run, beside the continuous / static comparison. ``--control-code DIR``
serves the control arm from another checkout (``git worktree add DIR REV``): an A/B of code,
e.g. a change against the revision it would replace.

The rate: by default the ``max_sustainable_rate`` of a previous sweep
(``loadtest/results/sweep.json``, i.e. near the continuous batcher's capacity), else
2 req/s; ``--rate`` overrides both.

    .venv/bin/python -m loadtest sweep --spawn-server build/onnx/default
    .venv/bin/python -m loadtest compare --spawn-server build/onnx/default --duration 120
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtest.client import (
    RESULTS_DIR,
    RequestRecord,
    add_common_arguments,
    make_client,
    parse_env_pairs,
    pin_client,
    run_async,
    sampler_from_args,
    scrape_metrics,
    server_command,
    spawned_server,
)
from loadtest.open_loop import (
    DEFAULT_MAX_IN_FLIGHT,
    measure_open_loop,
    poisson_schedule,
    run_open_loop,
)
from loadtest.report import (
    PERCENTILES,
    _pyplot,
    format_summary,
    latency_summary_ms,
    measurement_window,
    percentile,
    summarize,
    write_json,
)

POLICIES = ("continuous", "static")
# The third arm of ``--control``: a second batcher of either policy (static: the A/A).
CONTROL = "control"
DEFAULT_RATE = 2.0
DEFAULT_DURATION_S = 120.0
DEFAULT_STATIC_MAX_WAIT_MS = 10.0
DEFAULT_SWEEP_JSON = RESULTS_DIR / "sweep.json"

# (key in the table, label, where it sits in a run summary)
METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("p50_ms", "latency p50 (ms)", ("latency_ms", "p50")),
    ("p90_ms", "latency p90 (ms)", ("latency_ms", "p90")),
    ("p99_ms", "latency p99 (ms)", ("latency_ms", "p99")),
    ("throughput_rps", "throughput (req/s)", ("throughput_rps",)),
    ("tokens_per_s", "generated tokens/s", ("tokens_per_s",)),
    ("queue_wait_mean_ms", "mean queue wait (ms)", ("server", "queue_wait", "mean_ms")),
    ("rows_per_step_mean", "mean rows per step", ("server", "batch_rows", "mean")),
    ("decoder_calls_per_step", "decoder calls / step", ("server", "decoder_calls_per_step")),
    ("engine_busy_share", "engine busy share", ("engine_busy_share",)),
    ("encoder_lag_waits", "encoder lag waits", ("server", "encoder_lag_waits")),
    ("error_rate", "error rate", ("error_rate",)),
)


def rate_from_sweep(path: Path) -> float | None:
    """The ``max_sustainable_rate`` of a sweep's JSON, or None (no file, no passing step)."""
    try:
        rate = json.loads(path.read_text()).get("max_sustainable_rate")
    except (OSError, ValueError, AttributeError):
        return None
    return float(rate) if isinstance(rate, int | float) and rate > 0 else None


def resolve_rate(rate: float | None, sweep_json: Path) -> tuple[float, str]:
    """The rate to offer and where it came from."""
    if rate is not None:
        return rate, "--rate"
    swept = rate_from_sweep(sweep_json)
    if swept is not None:
        return swept, f"max_sustainable_rate of {sweep_json}"
    return DEFAULT_RATE, f"default (no sweep result in {sweep_json})"


def policy_env(policy: str, static_max_wait_ms: float, extra: Mapping[str, str]) -> dict[str, str]:
    """The spawned service's environment: ``--server-env``, then the policy (which wins)."""
    return {
        **extra,
        "MT_BATCHING": policy,
        "MT_STATIC_MAX_WAIT_MS": f"{static_max_wait_ms:g}",
    }


def _lookup(summary: Mapping[str, Any], path: Sequence[str]) -> float | None:
    value: Any = summary
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) else None


def arms_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The services a run loads: both policies, and the ``--control`` batcher."""
    return (*POLICIES, CONTROL) if args.control else POLICIES


def policy_of(arm: str, args: argparse.Namespace) -> str:
    """The batching policy of ``arm``: its name, or ``--control``'s for the control."""
    return str(args.control) if arm == CONTROL else arm


def arm_setting(text: str) -> tuple[str, str, str]:
    """``--arm-env``'s ``ARM:KEY=VALUE``, split once: (arm, key, value)."""
    arm, _, pair = text.partition(":")
    key, equals, value = pair.partition("=")
    if not arm or not key or not equals:
        raise argparse.ArgumentTypeError(f"expected ARM:KEY=VALUE, got {text!r}")
    return arm, key, value


def arm_env(args: argparse.Namespace, arm: str) -> dict[str, str]:
    """``--server-env``, then the ``--arm-env`` settings of ``arm``."""
    env = parse_env_pairs(args.server_env)
    env |= {key: value for name, key, value in args.arm_env if name == arm}
    return env


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if denominator in (None, 0) or numerator is None:
        return None
    return round(numerator / denominator, 3)


def compare_summaries(
    summaries: Mapping[str, Mapping[str, Any]], control_policy: str = "static"
) -> dict[str, dict[str, Any]]:
    """``{metric: {"continuous": x, "static": y, "static/continuous": y / x}}``, and with a
    control run ``"control": z, "control/static": z / y`` (or ``"control/continuous"``, the
    arm of the control's policy); a value the run lacks (no server metrics, no successes) is
    None, and so is its ratio."""
    table: dict[str, dict[str, Any]] = {}
    for key, _, path in METRICS:
        row: dict[str, Any] = {arm: _lookup(summary, path) for arm, summary in summaries.items()}
        row["static/continuous"] = _ratio(row["static"], row["continuous"])
        if CONTROL in summaries:
            row[f"control/{control_policy}"] = _ratio(row[CONTROL], row[control_policy])
        table[key] = row
    return table


# A request whose answer has at most this many tokens counts as short (a UI string); longer
# ones are paragraphs. Latency is reported for each kind: a policy can win the median on UI
# strings and lose the tail on paragraphs.
SHORT_OUTPUT_TOKENS = 14


def latency_by_length(records: Sequence[RequestRecord]) -> dict[str, dict[str, Any]]:
    """Latency summaries (200s only) of short and long requests, by output tokens."""
    kinds: dict[str, list[float]] = {"short": [], "long": []}
    for record in records:
        if record.ok and record.latency_s is not None and record.output_tokens is not None:
            kind = "short" if record.output_tokens <= SHORT_OUTPUT_TOKENS else "long"
            kinds[kind].append(record.latency_s)
    return {
        kind: {"requests": len(values), "latency_ms": latency_summary_ms(values)}
        for kind, values in kinds.items()
    }


def format_comparison(table: Mapping[str, Mapping[str, Any]]) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    first = next(iter(table.values()), {})
    ratio = next((key for key in first if key.startswith(f"{CONTROL}/")), None)
    header = f"{'':<22}{'continuous':>12}{'static':>12}{'static/cont.':>14}"
    lines = [header + (f"{CONTROL:>12}{ratio:>20}" if ratio else "")]
    for key, label, _ in METRICS:
        row = table[key]
        line = (
            f"{label:<22}{cell(row['continuous']):>12}{cell(row['static']):>12}"
            f"{cell(row['static/continuous']):>14}"
        )
        if ratio:
            line += f"{cell(row[CONTROL]):>12}{cell(row[ratio]):>20}"
        lines.append(line)
    return "\n".join(lines)


def plot_comparison(
    path: Path,
    records: Mapping[str, Sequence[RequestRecord]],
    table: Mapping[str, Mapping[str, Any]],
    title: str,
) -> Path | None:
    """Latency CDF of both runs beside their p50/p90/p99 bars."""
    try:
        plt = _pyplot()
    except ImportError:
        print("matplotlib is not installed; no plot")
        return None
    figure, (cdf, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    arms = tuple(records)
    for policy in arms:
        runs = records[policy]
        latencies_ms = sorted(r.latency_s * 1000 for r in runs if r.ok and r.latency_s is not None)
        if not latencies_ms:
            continue
        # Over all requests, so failures keep the curve below 1 instead of vanishing.
        fractions = [(i + 1) / len(runs) for i in range(len(latencies_ms))]
        cdf.step(latencies_ms, fractions, where="post", label=policy)
        p99 = percentile(latencies_ms, 99)
        cdf.axvline(p99, linestyle=":", color=cdf.lines[-1].get_color(), linewidth=1)
    cdf.set_xscale("log")
    cdf.set_xlabel("latency (ms, log scale; dotted: p99)")
    cdf.set_ylabel("fraction of requests answered 200")
    cdf.set_ylim(0, 1.02)
    cdf.set_title("latency CDF")
    cdf.legend(loc="lower right")
    width = 0.76 / len(arms)
    offsets = [width * (index - (len(arms) - 1) / 2) for index in range(len(arms))]
    for offset, policy in zip(offsets, arms, strict=True):
        values = [table[f"p{q}_ms"][policy] for q in PERCENTILES]
        positions = [i + offset for i in range(len(PERCENTILES))]
        heights = [math.nan if v is None else v for v in values]
        drawn = bars.bar(positions, heights, width, label=policy)
        bars.bar_label(drawn, fmt="%.0f", fontsize=8)
    bars.set_xticks(range(len(PERCENTILES)), [f"p{q}" for q in PERCENTILES])
    bars.set_ylabel("latency (ms)")
    bars.set_title("latency percentiles (200 only)")
    bars.legend()
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def policy_server(args: argparse.Namespace, arm: str) -> contextlib.AbstractContextManager[str]:
    """The service of ``arm`` started (a context manager yielding its URL)."""
    log_path = args.results_dir / f"{args.name}.{arm}.server.log"
    print(f"\n=== {arm}: starting the service (log: {log_path}) ...", flush=True)
    return spawned_server(
        args.spawn_server,
        command=server_command(args),
        extra_env=policy_env(policy_of(arm, args), args.static_max_wait_ms, arm_env(args, arm)),
        ready_timeout_s=args.ready_timeout,
        log_path=log_path,
        cwd=args.control_code if arm == CONTROL else None,
    )


def code_revision(checkout: Path) -> dict[str, str | None]:
    """Where ``--control-code`` served from, and its git revision (None outside git)."""
    revision = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return {
        "path": str(checkout.resolve()),
        "revision": revision.stdout.strip() if revision.returncode == 0 else None,
    }


# The warm-up's inputs and arrivals come from another seed: none of its texts is measured.
WARMUP_SEED_OFFSET = 104_729


def warm_up(args: argparse.Namespace, policy: str, url: str, rate: float) -> None:
    """``args.warmup`` seconds of the cell's load, not measured: a fresh process's first
    seconds (pools growing to the batch's sizes, cost models refitting, code paths taken
    for the first time) are the start-up's, not the policy's, and in a 30 s cell one slow
    start is the whole p99."""
    if args.warmup <= 0:
        return
    seed = args.seed + WARMUP_SEED_OFFSET
    records, _ = run_async(
        measure_open_loop(
            url,
            rate,
            sampler_from_args(args, seed),
            duration_s=args.warmup,
            count=None,
            seed=seed,
            max_in_flight=args.max_in_flight,
            timeout_s=args.timeout,
        )
    )
    ok = sum(record.ok for record in records)
    print(f"{policy}: warmed up, {ok}/{len(records)} ok in {args.warmup:g} s", flush=True)


def run_policy(
    args: argparse.Namespace, policy: str, rate: float
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Start the service with ``policy``, warm it up, run the open-loop schedule, stop it."""
    with policy_server(args, policy) as url:
        warm_up(args, policy, url, rate)
        print(f"{policy}: {rate:g} req/s Poisson for {args.duration:g} s against {url}", flush=True)
        records, summary = run_async(
            measure_open_loop(
                url,
                rate,
                sampler_from_args(args),  # a fresh sampler: the same inputs for both policies
                duration_s=args.duration,
                count=None,
                seed=args.seed,
                max_in_flight=args.max_in_flight,
                timeout_s=args.timeout,
                sample_every_s=args.sample_every,
            )
        )
    print(format_summary(summary), flush=True)
    return records, summary


def interleaved_plan(
    schedule: Sequence[float], duration_s: float, segments: int, arms: Sequence[str] = POLICIES
) -> list[tuple[float, list[int], tuple[str, ...]]]:
    """The schedule cut into ``segments`` windows of equal length: for each, its start (s),
    the indices of its arrivals, and the order in which the arms get it (rotating by one a
    segment: with two arms, alternating), so each arm goes first equally often."""
    if segments < 1:
        raise ValueError("segments must be at least 1")
    length = duration_s / segments
    plan = []
    for segment in range(segments):
        start = segment * length
        last = segment == segments - 1
        indices = [
            index
            for index, offset in enumerate(schedule)
            if start <= offset and (last or offset < start + length)
        ]
        shift = segment % len(arms)
        plan.append((start, indices, (*arms[shift:], *arms[:shift])))
    return plan


async def _measure_interleaved(
    urls: Mapping[str, str], rate: float, args: argparse.Namespace
) -> tuple[dict[str, list[RequestRecord]], dict[str, dict[str, Any]]]:
    """Every segment of one schedule against each arm in turn (``interleaved_plan``)."""
    schedule = poisson_schedule(rate, duration_s=args.duration, seed=args.seed)
    arms = tuple(urls)
    plan = interleaved_plan(schedule, args.duration, args.interleave, arms)
    samplers = {arm: sampler_from_args(args) for arm in arms}  # the same inputs for each
    records: dict[str, list[RequestRecord]] = {arm: [] for arm in arms}
    windows = dict.fromkeys(arms, 0.0)
    segment_length = args.duration / args.interleave
    async with make_client(args.max_in_flight + 2, args.timeout) as client:
        before = {arm: await scrape_metrics(client, urls[arm]) for arm in arms}
        for number, (start, indices, order) in enumerate(plan):
            offsets = [schedule[index] - start for index in indices]
            for policy in order:
                segment = await run_open_loop(
                    client,
                    urls[policy],
                    offsets,
                    samplers[policy],
                    max_in_flight=args.max_in_flight,
                )
                windows[policy] += measurement_window(segment, segment_length)
                for record, index in zip(segment, indices, strict=True):
                    # the segment ran on its own clock, from its first window's start: both
                    # times move to the schedule's, so the sender's lag stays sent - scheduled
                    record.index, record.scheduled_s = index, schedule[index]
                    if record.sent_s is not None:
                        record.sent_s += start
                records[policy] += segment
                ok = sum(record.ok for record in segment)
                print(
                    f"segment {number + 1}/{len(plan)} {policy}: {ok}/{len(segment)} ok", flush=True
                )
        after = {arm: await scrape_metrics(client, urls[arm]) for arm in arms}
    summaries = {
        policy: summarize(
            records[policy],
            duration_s=windows[policy],
            metrics_before=before[policy],
            metrics_after=after[policy],
        )
        for policy in arms
    }
    return records, summaries


def run_interleaved(
    args: argparse.Namespace, rate: float
) -> tuple[dict[str, list[RequestRecord]], dict[str, dict[str, Any]]]:
    """Start one service per arm, load them in rotating segments, stop them."""
    arms = arms_of(args)
    with contextlib.ExitStack() as stack:
        urls = {arm: stack.enter_context(policy_server(args, arm)) for arm in arms}
        for arm in arms:
            warm_up(args, arm, urls[arm], rate)
        records, summaries = run_async(_measure_interleaved(urls, rate, args))
    for policy in arms:
        print(f"\n=== {policy}\n" + format_summary(summaries[policy]), flush=True)
    return records, summaries


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.compare_batching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="arrivals per second (default: max_sustainable_rate from --sweep-json, "
        f"else {DEFAULT_RATE:g})",
    )
    parser.add_argument(
        "--sweep-json",
        type=Path,
        default=DEFAULT_SWEEP_JSON,
        help="sweep result the default rate is read from (default %(default)s)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        help="seconds of arrivals per policy (default %(default)s)",
    )
    parser.add_argument(
        "--static-max-wait-ms",
        type=float,
        default=DEFAULT_STATIC_MAX_WAIT_MS,
        help="MT_STATIC_MAX_WAIT_MS of the static run (default %(default)s)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help="outstanding-request cap; beyond it arrivals are dropped",
    )
    parser.add_argument(
        "--sample-every",
        type=float,
        default=1.0,
        help="seconds between /metrics samples of queue, batch, knee and engine busy share "
        "during each run (the summary's timeline; 0: none)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="seconds of the same load, with other inputs, each service gets before it is "
        "measured (default %(default)s; 0: none)",
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="K",
        help="run both services at once and alternate K segments of the schedule between "
        "them (see above); 0 (default): one policy after the other",
    )
    parser.add_argument(
        "--control",
        nargs="?",
        const="static",
        choices=POLICIES,
        default=None,
        help="also load a second batcher of this policy (default static; the 'control' "
        "arm): its ratios to the arm of its policy are an A/A comparison, the noise floor "
        "of this run's continuous / static ratios, or with --arm-env an A/B",
    )
    parser.add_argument(
        "--control-code",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve the control arm from this checkout (e.g. `git worktree add DIR main`), "
        "with this interpreter and model directory: an A/B of code in the same run",
    )
    parser.add_argument(
        "--arm-env",
        action="append",
        default=[],
        type=arm_setting,
        metavar="ARM:KEY=VALUE",
        help="extra environment for one arm's service only (continuous, static or control; "
        "after --server-env; repeatable), e.g. control:MT_ADMISSION_MAX_TOKENS=512",
    )
    add_common_arguments(parser, default_name="compare-batching")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.spawn_server:
        parser.error("--spawn-server MODEL_DIR is required: the service is started once per policy")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    if args.interleave < 0:
        parser.error("--interleave must be 0 or more")
    arms = arms_of(args)
    for arm, key, value in args.arm_env:
        if arm not in arms:
            parser.error(f"--arm-env {arm}:{key}={value}: ARM is one of {arms}")
    if args.control_code is not None:
        if not args.control:
            parser.error("--control-code needs --control (the arm it serves)")
        if not (args.control_code / "service").is_dir():
            parser.error(f"--control-code {args.control_code}: no service/ there")
    rate, rate_source = resolve_rate(args.rate, args.sweep_json)
    pin_client(args)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(
        f"comparing {' and '.join(arms)} batching at {rate:g} req/s ({rate_source}), "
        f"{args.duration:g} s each, seed {args.seed}",
        flush=True,
    )
    records: dict[str, list[RequestRecord]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    if args.interleave:
        records, summaries = run_interleaved(args, rate)
    else:
        for arm in arms:
            records[arm], summaries[arm] = run_policy(args, arm, rate)
    table = compare_summaries(summaries, args.control or "static")
    print("\n" + format_comparison(table))
    for policy in arms:
        summaries[policy]["by_length"] = latency_by_length(records[policy])
        print(
            f"{policy:<11}"
            + "  ".join(
                f"{kind} ({part['requests']}) p50 {part['latency_ms']['p50']} "
                f"p99 {part['latency_ms']['p99']} ms"
                for kind, part in summaries[policy]["by_length"].items()
            )
        )
    for policy in arms:
        if not summaries[policy]["server"].get("available"):
            print(f"warning: no /metrics from the {policy} run; queue wait and rows are missing")
    document = {
        "kind": "compare_batching",
        "started_at": started_at,
        "config": {
            "rate": rate,
            "rate_source": rate_source,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "interleave": args.interleave,
            "control": args.control,
            "arm_env": {arm: arm_env(args, arm) for arm in arms},
            "control_code": code_revision(args.control_code) if args.control_code else None,
            "static_max_wait_ms": args.static_max_wait_ms,
            "max_in_flight": args.max_in_flight,
            "timeout_s": args.timeout,
            "model_dir": args.spawn_server,
            "server_env": parse_env_pairs(args.server_env),
            "server_cpus": args.server_cpus,
            "client_cpus": args.client_cpus,
            "inputs": sampler_from_args(args).describe(),
        },
        "comparison": table,
        "runs": {
            policy: {
                "summary": summaries[policy],
                "records": [r.as_dict() for r in records[policy]],
            }
            for policy in arms
        },
    }
    json_path = write_json(args.results_dir / f"{args.name}.json", document)
    print(f"wrote {json_path}")
    if not args.no_plot:
        plot = plot_comparison(
            args.results_dir / f"{args.name}.png",
            records,
            table,
            f"continuous vs static batching, {rate:g} req/s Poisson, {args.duration:g} s each "
            f"(static max wait {args.static_max_wait_ms:g} ms)",
        )
        if plot:
            print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
