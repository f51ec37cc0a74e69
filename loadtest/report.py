"""Summaries of load-test runs: percentiles, throughput, server-side metrics deltas, JSON
and PNG output.

Server metrics are found by name pattern in ``/metrics`` (scraped before and after a run),
not hard-coded, and every one is optional: without them the report says so and falls back
(tokens from the response bodies, else characters).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtest.client import STATUS_DROPPED, STATUS_TRANSPORT_ERROR, MetricSamples, RequestRecord
from loadtest.machine import machine_facts

PERCENTILES = (50, 90, 99)

# Patterns that find the service's metrics (see service/metrics.py) without pinning names.
QUEUE_WAIT_PATTERN = r"queue_wait(_seconds)?$"
GENERATED_TOKENS_PATTERN = r"generated_tokens(_total)?$"
BATCH_ROWS_PATTERN = r"(?<!admitted_)batch_rows$"
CACHE_HITS_PATTERN = r"cache_hits(_total)?$"
ENGINE_BUSY_PATTERN = r"engine_busy_seconds(_total)?$"
DECODER_CALLS_PATTERN = r"decoder_calls(_total)?$"
DECODE_STEPS_PATTERN = r"decode_steps(_total)?$"
ENCODER_LAG_WAITS_PATTERN = r"encoder_lag_waits(_total)?$"
QUEUE_DEPTH_PATTERN = r"queue_depth$"
INFLIGHT_ROWS_PATTERN = r"inflight_rows$"
ROW_LIMIT_PATTERN = r"admission_row_limit$"
ENGINE_PHASE_PATTERN = r"engine_phase_seconds(_total)?$"
THREAD_CPU_PATTERN = r"thread_cpu_seconds(_total)?$"
THREAD_RUNQUEUE_PATTERN = r"thread_runqueue_seconds(_total)?$"
ADMISSION_STALL_PATTERN = r"admission_stall_seconds$"
ADMITTED_ROWS_PATTERN = r"batch_admitted_rows$"
DEFERRALS_PATTERN = r"admission_deferrals(_total)?$"
CHOICE_CPU_PATTERN = r"admission_choice_cpu_seconds(_total)?$"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default method); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def latency_summary_ms(latencies_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99/max/mean in milliseconds; None when there were no values."""
    if not latencies_s:
        empty: dict[str, float | None] = {f"p{q}": None for q in PERCENTILES}
        return empty | {"max": None, "mean": None}
    summary: dict[str, float | None] = {
        f"p{q}": round(percentile(latencies_s, q) * 1000, 2) for q in PERCENTILES
    }
    summary["max"] = round(max(latencies_s) * 1000, 2)
    summary["mean"] = round(sum(latencies_s) / len(latencies_s) * 1000, 2)
    return summary


def status_label(status: int) -> str:
    if status == STATUS_DROPPED:
        return "dropped"
    if status == STATUS_TRANSPORT_ERROR:
        return "transport_error"
    return str(status)


# --- metrics deltas -----------------------------------------------------------------------


def _family_names(samples: MetricSamples) -> set[str]:
    return {name for name, _ in samples}


def find_counter(samples: MetricSamples, pattern: str) -> str | None:
    """The name of the first counter sample (not ``*_created``) whose name matches."""
    regex = re.compile(pattern)
    matches = sorted(
        name
        for name in _family_names(samples)
        if regex.search(name) and not name.endswith(("_created", "_bucket", "_count", "_sum"))
    )
    return matches[0] if matches else None


def find_histogram(samples: MetricSamples, pattern: str) -> str | None:
    """The base name of the first histogram (has ``_bucket``) whose base name matches."""
    regex = re.compile(pattern)
    matches = sorted(
        name.removesuffix("_bucket")
        for name in _family_names(samples)
        if name.endswith("_bucket") and regex.search(name.removesuffix("_bucket"))
    )
    return matches[0] if matches else None


def _total(samples: MetricSamples, name: str) -> float:
    """Sum of a sample over all label sets."""
    return sum(value for (sample_name, _), value in samples.items() if sample_name == name)


def _buckets(samples: MetricSamples, base: str) -> dict[float, float]:
    """Cumulative bucket counts by upper bound, summed over label sets other than ``le``."""
    buckets: dict[float, float] = {}
    for (name, labels), value in samples.items():
        if name != base + "_bucket":
            continue
        le = dict(labels).get("le")
        if le is None:
            continue
        bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + value
    return buckets


def counter_delta(
    before: MetricSamples, after: MetricSamples, pattern: str
) -> tuple[str, float] | None:
    name = find_counter(after, pattern)
    if name is None:
        return None
    return name, _total(after, name) - _total(before, name)


def counter_delta_by(
    before: MetricSamples, after: MetricSamples, pattern: str, label: str
) -> dict[str, float] | None:
    """A labelled counter's growth between two scrapes, by the value of ``label``."""
    name = find_counter(after, pattern)
    if name is None:
        return None

    def by_label(samples: MetricSamples) -> dict[str, float]:
        values: dict[str, float] = {}
        for (sample_name, labels), value in samples.items():
            if sample_name == name:
                key = dict(labels).get(label, "")
                values[key] = values.get(key, 0.0) + value
        return values

    start, end = by_label(before), by_label(after)
    return {key: round(value - start.get(key, 0.0), 3) for key, value in sorted(end.items())}


def histogram_quantile(q: float, cumulative_buckets: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket that holds
    the q-quantile (0..1); the lowest bucket starts at 0; a quantile in the +Inf bucket
    returns the highest finite bound."""
    bounds = sorted(cumulative_buckets)
    if not bounds or cumulative_buckets[bounds[-1]] <= 0:
        return None
    total = cumulative_buckets[bounds[-1]]
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound in bounds:
        count = cumulative_buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return previous_bound
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (
                count - previous_count
            )
        previous_bound, previous_count = bound, count
    return previous_bound


def histogram_delta(
    before: MetricSamples, after: MetricSamples, pattern: str
) -> dict[str, Any] | None:
    """Count, sum, mean and bucket-estimated p50/p90/p99 of what a histogram observed
    between two scrapes."""
    base = find_histogram(after, pattern)
    if base is None:
        return None
    count = _total(after, base + "_count") - _total(before, base + "_count")
    total = _total(after, base + "_sum") - _total(before, base + "_sum")
    after_buckets, before_buckets = _buckets(after, base), _buckets(before, base)
    delta_buckets = {b: after_buckets[b] - before_buckets.get(b, 0.0) for b in after_buckets}
    result: dict[str, Any] = {
        "metric": base,
        "count": count,
        "sum": total,
        "mean": total / count if count > 0 else None,
    }
    for q in PERCENTILES:
        result[f"p{q}"] = histogram_quantile(q / 100, delta_buckets) if count > 0 else None
    return result


def server_metrics_delta(
    before: MetricSamples | None, after: MetricSamples | None
) -> dict[str, Any]:
    """What the service reports about the run: queue wait, generated tokens, rows per step,
    cache hits. Missing metrics are reported as missing."""
    if before is None or after is None:
        return {"available": False}
    queue_wait_s = histogram_delta(before, after, QUEUE_WAIT_PATTERN)
    queue_wait = None
    if queue_wait_s is not None:
        queue_wait = {"metric": queue_wait_s["metric"], "count": queue_wait_s["count"]}
        for key in ("mean", *(f"p{q}" for q in PERCENTILES)):
            value = queue_wait_s[key]
            queue_wait[f"{key}_ms"] = None if value is None else round(value * 1000, 2)
    batch_rows = histogram_delta(before, after, BATCH_ROWS_PATTERN)
    tokens = counter_delta(before, after, GENERATED_TOKENS_PATTERN)
    cache_hits = counter_delta(before, after, CACHE_HITS_PATTERN)
    busy = counter_delta(before, after, ENGINE_BUSY_PATTERN)
    calls = counter_delta(before, after, DECODER_CALLS_PATTERN)
    steps = counter_delta(before, after, DECODE_STEPS_PATTERN)
    lag_waits = counter_delta(before, after, ENCODER_LAG_WAITS_PATTERN)
    stall = histogram_delta(before, after, ADMISSION_STALL_PATTERN)
    admitted = histogram_delta(before, after, ADMITTED_ROWS_PATTERN)
    deferrals = counter_delta(before, after, DEFERRALS_PATTERN)
    choice_cpu = counter_delta(before, after, CHOICE_CPU_PATTERN)
    return {
        "available": True,
        "queue_wait": queue_wait,
        "batch_rows": batch_rows,
        # engine thread time in admissions and steps (its share of the run: see summarize)
        "engine_busy_s": None if busy is None else round(busy[1], 3),
        "decoder_calls_per_step": (
            round(calls[1] / steps[1], 3) if calls is not None and steps and steps[1] else None
        ),
        "generated_tokens": None if tokens is None else {"metric": tokens[0], "delta": tokens[1]},
        # times the engine thread stopped stepping for an encoder call past its lag bound
        "encoder_lag_waits": None if lag_waits is None else lag_waits[1],
        "cache_hits": None
        if cache_hits is None
        else {"metric": cache_hits[0], "delta": cache_hits[1]},
        # the engine thread's wall seconds by phase (service/scheduling/timeline.py), and each
        # serving thread's CPU and run-queue seconds (schedstat)
        "engine_phases_s": counter_delta_by(before, after, ENGINE_PHASE_PATTERN, "phase"),
        "thread_cpu_s": counter_delta_by(before, after, THREAD_CPU_PATTERN, "thread"),
        "thread_runqueue_s": counter_delta_by(before, after, THREAD_RUNQUEUE_PATTERN, "thread"),
        # admissions (encoder work joining the batch) and the choices that deferred everyone
        "admissions": None
        if admitted is None or not admitted["count"]
        else {"count": admitted["count"], "mean_rows": round(admitted["mean"], 3)},
        "admission_deferrals": None if deferrals is None else deferrals[1],
        # the engine thread's CPU seconds in those choices (capacity, on one core)
        "admission_choice_cpu_s": None if choice_cpu is None else round(choice_cpu[1], 3),
        "admission_stall": None
        if stall is None or not stall["count"]
        else {
            "count": stall["count"],
            "mean_ms": round(stall["mean"] * 1000, 3),
            "p99_ms": None if stall["p99"] is None else round(stall["p99"] * 1000, 3),
        },
    }


# --- run summary --------------------------------------------------------------------------


def summarize(
    records: Sequence[RequestRecord],
    *,
    duration_s: float,
    metrics_before: MetricSamples | None = None,
    metrics_after: MetricSamples | None = None,
) -> dict[str, Any]:
    """The numbers of one run.

    ``duration_s`` is the measurement window: from the start of the run until the last
    response (or the end of the schedule, whichever is later). Rates divide by it.
    """
    ok = [r for r in records if r.ok]
    sent = [r for r in records if not r.dropped]
    latencies = [r.latency_s for r in ok if r.latency_s is not None]
    # Sender lag: how late the load generator sent each request relative to its schedule.
    # Large values mean the generator, not the service, limited the run.
    sender_lag = [r.sent_s - r.scheduled_s for r in sent if r.sent_s is not None]
    statuses = Counter(status_label(r.status) for r in records)
    failures = len(records) - len(ok)
    server = server_metrics_delta(metrics_before, metrics_after)
    window = max(duration_s, 1e-9)

    response_tokens = [r.output_tokens for r in ok]
    tokens_from_responses = (
        sum(t for t in response_tokens if t is not None)
        if ok and None not in response_tokens
        else None
    )
    if server.get("generated_tokens"):
        tokens, tokens_source = server["generated_tokens"]["delta"], "server_metrics"
    elif tokens_from_responses is not None:
        tokens, tokens_source = tokens_from_responses, "responses"
    else:
        tokens, tokens_source = None, None
    output_chars = sum(r.output_chars for r in ok)

    return {
        "requests": len(records),
        "sent": len(sent),
        "ok": len(ok),
        "failed": failures,
        "error_rate": failures / len(records) if records else 0.0,
        "by_status": dict(sorted(statuses.items())),
        "duration_s": round(duration_s, 3),
        "offered_rps": round(len(records) / window, 3),
        "throughput_rps": round(len(ok) / window, 3),
        "latency_ms": latency_summary_ms(latencies),
        "sender_lag_ms": latency_summary_ms(sender_lag),
        "tokens_per_s": None if tokens is None else round(tokens / window, 2),
        "tokens": tokens,
        "tokens_source": tokens_source,
        "output_chars_per_s": round(output_chars / window, 2),
        "input_chars_per_s": round(sum(r.input_chars for r in ok) / window, 2),
        "server": server,
        "engine_busy_share": (
            round(server["engine_busy_s"] / window, 3) if server.get("engine_busy_s") else None
        ),
    }


def timeline_point(offset_s: float, samples: MetricSamples) -> dict[str, float | None]:
    """One sample of the service's state during a run (``open_loop.sample_timeline``): queue depth and
    rows in the batch (gauges, summed over models), the admission knee, and the counters
    whose differences give engine busy share, steps and decoder calls per interval."""

    def counter(pattern: str) -> float | None:
        name = find_counter(samples, pattern)
        return None if name is None else _total(samples, name)

    return {
        "t_s": round(offset_s, 3),
        "queue_depth": counter(QUEUE_DEPTH_PATTERN),
        "inflight_rows": counter(INFLIGHT_ROWS_PATTERN),
        "row_limit": counter(ROW_LIMIT_PATTERN),
        "engine_busy_s": counter(ENGINE_BUSY_PATTERN),
        "decode_steps": counter(DECODE_STEPS_PATTERN),
        "decoder_calls": counter(DECODER_CALLS_PATTERN),
        "generated_tokens": counter(GENERATED_TOKENS_PATTERN),
    }


def measurement_window(records: Iterable[RequestRecord], schedule_end_s: float) -> float:
    """From the run's start (0) to the last completion or the end of the schedule."""
    completions = [r.completed_s for r in records if r.completed_s is not None]
    return max([schedule_end_s, *completions]) if completions else schedule_end_s


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few human-readable lines."""
    lat = summary["latency_ms"]
    lines = [
        f"requests {summary['requests']}  ok {summary['ok']}  failed {summary['failed']}  "
        f"by status {summary['by_status']}",
        f"offered {summary['offered_rps']:.2f} req/s  throughput {summary['throughput_rps']:.2f} req/s  "
        f"over {summary['duration_s']:.1f} s",
        "latency ms  " + "  ".join(f"{k} {_fmt(v)}" for k, v in lat.items()),
        f"sender lag ms  p99 {_fmt(summary['sender_lag_ms']['p99'])}  max {_fmt(summary['sender_lag_ms']['max'])}",
    ]
    if summary["tokens_per_s"] is not None:
        lines.append(f"tokens/s {summary['tokens_per_s']:.1f} (from {summary['tokens_source']})")
    lines.append(f"output chars/s {summary['output_chars_per_s']:.1f}")
    server = summary["server"]
    if not server.get("available"):
        lines.append("server metrics: not available")
    else:
        queue_wait = server.get("queue_wait")
        if queue_wait and queue_wait["count"]:
            lines.append(
                f"queue wait ms (server histogram, {int(queue_wait['count'])} sentences)  mean "
                f"{_fmt(queue_wait.get('mean_ms'))}  bucket estimates: p50 "
                f"{_fmt(queue_wait.get('p50_ms'))}  p99 {_fmt(queue_wait.get('p99_ms'))}"
            )
        elif queue_wait is None:
            lines.append("queue wait: no queue-wait histogram in /metrics")
        rows = server.get("batch_rows")
        if rows and rows["mean"] is not None:
            lines.append(
                f"rows per decoder step: mean {rows['mean']:.2f} over {int(rows['count'])} steps"
            )
        if server.get("decoder_calls_per_step") is not None:
            lines.append(f"decoder calls per step: {server['decoder_calls_per_step']:.2f}")
        if summary.get("engine_busy_share") is not None:
            lines.append(f"engine busy share of the run: {summary['engine_busy_share']:.1%}")
        if server.get("encoder_lag_waits"):
            lines.append(
                f"encoder lag waits: {int(server['encoder_lag_waits'])} (steps held for an "
                "encoder call past the lag bound, ENCODER_MAX_LAG_S)"
            )
        if server.get("engine_phases_s"):
            phases = ", ".join(f"{k} {v:.2f}" for k, v in server["engine_phases_s"].items() if v)
            lines.append(f"engine thread seconds by phase: {phases}")
        for role, cpu_s in (server.get("thread_cpu_s") or {}).items():
            queued = (server.get("thread_runqueue_s") or {}).get(role)
            lines.append(
                f"thread {role}: {cpu_s:.2f} s CPU, {queued or 0:.2f} s waiting for a core"
            )
        if server.get("admission_stall"):
            stall = server["admission_stall"]
            lines.append(
                f"admissions that stalled running rows: {int(stall['count'])}, mean "
                f"{stall['mean_ms']:.2f} ms, p99 {stall['p99_ms']} ms"
            )
        hits = server.get("cache_hits")
        if hits and hits["delta"]:
            lines.append(f"warning: {int(hits['delta'])} sentences came from the translation cache")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# --- output -------------------------------------------------------------------------------


def write_json(path: Path, document: Mapping[str, Any]) -> Path:
    """Write a result document, with the machine it was measured on (``machine``: CPU, SIMD
    flags, load) unless the document names one itself."""
    document = {"machine": machine_facts(), **document}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=_json_default) + "\n")
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_run(
    results_dir: Path,
    name: str,
    document: Mapping[str, Any],
    records: Sequence[RequestRecord],
    title: str,
    plot: bool = True,
) -> None:
    """Write a single run's JSON and, unless ``plot`` is off, its latency plot; say where."""
    print(f"wrote {write_json(results_dir / f'{name}.json', document)}")
    if plot:
        png = plot_run(results_dir / f"{name}.png", records, title)
        if png:
            print(f"wrote {png}")


def plot_run(path: Path, records: Sequence[RequestRecord], title: str) -> Path | None:
    """Latency over time (by status) beside the latency histogram with its percentiles."""
    try:
        plt = _pyplot()
    except ImportError:
        print("matplotlib is not installed; no plot")
        return None
    figure, (over_time, histogram) = plt.subplots(1, 2, figsize=(12, 4.5))
    # (scheduled send time, latency ms) of the answered requests and of the failed ones
    ok = [(r.scheduled_s, r.latency_s * 1000) for r in records if r.ok and r.latency_s is not None]
    failed = [
        (r.scheduled_s, r.latency_s * 1000)
        for r in records
        if not r.ok and not r.dropped and r.latency_s is not None
    ]
    over_time.scatter([at for at, _ in ok], [ms for _, ms in ok], s=6, label="200")
    if failed:
        over_time.scatter(
            [at for at, _ in failed],
            [ms for _, ms in failed],
            s=10,
            marker="x",
            color="tab:red",
            label="errors",
        )
    dropped = [r for r in records if r.dropped]
    if dropped:
        over_time.scatter(
            [r.scheduled_s for r in dropped],
            [0] * len(dropped),
            s=10,
            marker="|",
            color="black",
            label="dropped",
        )
    over_time.set_xlabel("scheduled send time (s)")
    over_time.set_ylabel("latency (ms)")
    over_time.set_title("latency over time")
    over_time.legend(loc="upper left")
    latencies_ms = [ms for _, ms in ok]
    if latencies_ms:
        histogram.hist(latencies_ms, bins=min(50, max(5, len(latencies_ms) // 5)))
        for q, style in zip(PERCENTILES, (":", "--", "-"), strict=True):
            value = percentile(latencies_ms, q)
            histogram.axvline(value, color="tab:red", linestyle=style, label=f"p{q} {value:.0f} ms")
        histogram.legend()
    histogram.set_xlabel("latency (ms)")
    histogram.set_ylabel("requests")
    histogram.set_title("latency histogram (200 only)")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_sweep(
    path: Path, steps: Sequence[Mapping[str, Any]], slo_p99_ms: float, title: str
) -> Path | None:
    """Latency percentiles and throughput against offered load, with the SLO line."""
    try:
        plt = _pyplot()
    except ImportError:
        print("matplotlib is not installed; no plot")
        return None
    figure, axis = plt.subplots(figsize=(8, 5))
    rates = [step["rate"] for step in steps]
    for q in PERCENTILES:
        values = [step["summary"]["latency_ms"][f"p{q}"] for step in steps]
        axis.plot(rates, [math.nan if v is None else v for v in values], marker="o", label=f"p{q}")
    axis.axhline(slo_p99_ms, color="tab:red", linestyle="--", label=f"SLO p99 {slo_p99_ms:.0f} ms")
    axis.set_xlabel("offered load (req/s)")
    axis.set_ylabel("latency (ms)")
    axis.set_yscale("log")
    throughput_axis = axis.twinx()
    throughput_axis.plot(
        rates,
        [step["summary"]["throughput_rps"] for step in steps],
        color="gray",
        linestyle=":",
        marker="s",
    )
    throughput_axis.set_ylabel("throughput (req/s, gray)")
    axis.legend(loc="upper left")
    axis.set_title(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
