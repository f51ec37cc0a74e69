"""A run's report: percentiles, the summary, the server's metrics differenced over the run,
the Prometheus text parsed, and the soak's memory growth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtest.client import (
    STATUS_DROPPED,
    RequestRecord,
    parse_prometheus_text,
)
from loadtest.report import (
    histogram_quantile,
    percentile,
    server_metrics_delta,
    summarize,
    timeline_point,
)
from tests.loadtest.loadtest_helpers import ok_record


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear_interpolation(q):
    values = [float(v) for v in np.random.default_rng(0).exponential(0.2, size=101)]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([4.0], q) == 4.0
    assert math.isnan(percentile([], q))


def test_summary_counts_statuses_and_takes_percentiles_over_successes_only():
    records = [ok_record(i, latency_s=(i + 1) / 100, scheduled_s=i / 10) for i in range(100)]
    records += [
        RequestRecord(index=100, scheduled_s=1.0, sent_s=1.0, latency_s=9.0, status=429),
        RequestRecord(
            index=101, scheduled_s=1.0, sent_s=1.0, latency_s=30.0, status=0, error="timeout"
        ),
        RequestRecord(index=102, scheduled_s=1.0, status=STATUS_DROPPED),
    ]
    summary = summarize(records, duration_s=10.0)
    assert summary["requests"] == 103 and summary["ok"] == 100 and summary["failed"] == 3
    assert summary["by_status"] == {"200": 100, "429": 1, "dropped": 1, "transport_error": 1}
    assert summary["error_rate"] == pytest.approx(3 / 103)
    assert summary["latency_ms"]["p50"] == pytest.approx(505.0)
    assert summary["latency_ms"]["p99"] == pytest.approx(990.1)
    assert summary["latency_ms"]["max"] == pytest.approx(1000.0)
    assert summary["throughput_rps"] == pytest.approx(10.0)
    assert summary["offered_rps"] == pytest.approx(10.3)
    # No /metrics: tokens come from the response bodies.
    assert summary["tokens_source"] == "responses" and summary["tokens_per_s"] == pytest.approx(
        30.0
    )
    assert summary["server"] == {"available": False}


METRICS_BEFORE = """\
# HELP mt_queue_wait_seconds Time a sentence waited.
# TYPE mt_queue_wait_seconds histogram
mt_queue_wait_seconds_bucket{le="0.01"} 5.0
mt_queue_wait_seconds_bucket{le="0.1"} 5.0
mt_queue_wait_seconds_bucket{le="1.0"} 5.0
mt_queue_wait_seconds_bucket{le="+Inf"} 5.0
mt_queue_wait_seconds_count 5.0
mt_queue_wait_seconds_sum 0.02
mt_generated_tokens_total 100.0
mt_generated_tokens_created 1.7e9
mt_batch_rows_bucket{le="1.0"} 0.0
mt_batch_rows_bucket{le="4.0"} 0.0
mt_batch_rows_bucket{le="+Inf"} 0.0
mt_batch_rows_count 0.0
mt_batch_rows_sum 0.0
mt_batch_admitted_rows_bucket{le="+Inf"} 7.0
mt_batch_admitted_rows_count 7.0
mt_batch_admitted_rows_sum 70.0
mt_requests_total{route="/v1/translate",status="200"} 5.0
mt_engine_busy_seconds_total 1.5
mt_decode_steps_total 0.0
mt_decoder_calls_total 0.0
mt_encoder_lag_waits_total 1.0
"""


METRICS_AFTER = """\
mt_queue_wait_seconds_bucket{le="0.01"} 5.0
mt_queue_wait_seconds_bucket{le="0.1"} 15.0
mt_queue_wait_seconds_bucket{le="1.0"} 25.0
mt_queue_wait_seconds_bucket{le="+Inf"} 25.0
mt_queue_wait_seconds_count 25.0
mt_queue_wait_seconds_sum 4.02
mt_generated_tokens_total 400.0
mt_generated_tokens_created 1.7e9
mt_batch_rows_bucket{le="1.0"} 2.0
mt_batch_rows_bucket{le="4.0"} 10.0
mt_batch_rows_bucket{le="+Inf"} 10.0
mt_batch_rows_count 10.0
mt_batch_rows_sum 30.0
mt_requests_total{route="/v1/translate",status="200"} 25.0
mt_engine_busy_seconds_total 7.5
mt_decode_steps_total 10.0
mt_decoder_calls_total 25.0
mt_encoder_lag_waits_total 4.0
mt_queue_depth{model="a"} 3.0
mt_queue_depth{model="b"} 4.0
"""


def test_server_metrics_are_found_by_pattern_and_differenced():
    before, after = parse_prometheus_text(METRICS_BEFORE), parse_prometheus_text(METRICS_AFTER)
    delta = server_metrics_delta(before, after)
    queue_wait = delta["queue_wait"]
    assert queue_wait["metric"] == "mt_queue_wait_seconds"
    assert queue_wait["count"] == 20
    assert queue_wait["mean_ms"] == pytest.approx(200.0)
    # 20 new observations: 10 in (0.01, 0.1], 10 in (0.1, 1]; the median is the 0.1 bound.
    assert queue_wait["p50_ms"] == pytest.approx(100.0)
    assert queue_wait["p90_ms"] == pytest.approx(820.0)
    assert delta["generated_tokens"] == {"metric": "mt_generated_tokens_total", "delta": 300.0}
    assert delta["batch_rows"]["metric"] == "mt_batch_rows"  # not mt_batch_admitted_rows
    assert delta["batch_rows"]["mean"] == pytest.approx(3.0)
    assert delta["cache_hits"] is None
    assert delta["engine_busy_s"] == pytest.approx(6.0)
    assert delta["decoder_calls_per_step"] == pytest.approx(2.5)  # 25 calls over 10 steps
    assert delta["encoder_lag_waits"] == 3.0

    records = [ok_record(i, 0.1) for i in range(20)]
    summary = summarize(records, duration_s=10.0, metrics_before=before, metrics_after=after)
    assert summary["engine_busy_share"] == pytest.approx(0.6)  # 6 s busy in a 10 s window
    point = timeline_point(2.0, after)
    assert point["queue_depth"] == 7.0  # summed over models
    assert point["decode_steps"] == 10.0 and point["row_limit"] is None
    assert summary["tokens_source"] == "server_metrics" and summary[
        "tokens_per_s"
    ] == pytest.approx(30.0)


def test_the_engine_timeline_is_differenced_by_phase_and_thread():
    before = parse_prometheus_text(
        'mt_engine_phase_seconds_total{phase="decoder"} 1.0\n'
        'mt_engine_phase_seconds_total{phase="encode"} 0.5\n'
        'mt_thread_cpu_seconds_total{thread="engine"} 2.0\n'
        'mt_thread_runqueue_seconds_total{thread="engine"} 0.25\n'
    )
    after = parse_prometheus_text(
        'mt_engine_phase_seconds_total{phase="decoder"} 4.0\n'
        'mt_engine_phase_seconds_total{phase="encode"} 0.5\n'
        'mt_engine_phase_seconds_total{phase="place"} 0.125\n'
        'mt_thread_cpu_seconds_total{thread="engine"} 5.5\n'
        'mt_thread_cpu_seconds_total{thread="event_loop"} 1.0\n'
        'mt_thread_runqueue_seconds_total{thread="engine"} 1.0\n'
        'mt_admission_stall_seconds_bucket{le="0.001"} 3.0\n'
        'mt_admission_stall_seconds_bucket{le="+Inf"} 4.0\n'
        "mt_admission_stall_seconds_count 4.0\n"
        "mt_admission_stall_seconds_sum 0.01\n"
        'mt_batch_admitted_rows_bucket{le="+Inf"} 5.0\n'
        "mt_batch_admitted_rows_count 5.0\n"
        "mt_batch_admitted_rows_sum 12.0\n"
        "mt_admission_deferrals_total 7.0\n"
        "mt_admission_choice_cpu_seconds_total 0.25\n"
    )
    delta = server_metrics_delta(before, after)
    assert delta["admissions"] == {"count": 5, "mean_rows": 2.4}
    assert delta["admission_deferrals"] == 7
    assert delta["admission_choice_cpu_s"] == 0.25
    assert delta["engine_phases_s"] == {"decoder": 3.0, "encode": 0.0, "place": 0.125}
    assert delta["thread_cpu_s"] == {"engine": 3.5, "event_loop": 1.0}
    assert delta["thread_runqueue_s"] == {"engine": 0.75}
    assert delta["admission_stall"]["count"] == 4 and delta["admission_stall"]["mean_ms"] == 2.5


def test_report_degrades_when_metrics_are_missing():
    empty = parse_prometheus_text("# nothing here\nsome_other_metric 1\n")
    delta = server_metrics_delta(empty, empty)
    assert delta["available"] is True
    assert delta["queue_wait"] is None and delta["generated_tokens"] is None
    records = [
        RequestRecord(
            index=0, scheduled_s=0.0, sent_s=0.0, latency_s=0.1, status=200, output_chars=12
        )
    ]
    summary = summarize(records, duration_s=1.0, metrics_before=empty, metrics_after=empty)
    assert summary["tokens_per_s"] is None and summary["output_chars_per_s"] == pytest.approx(12.0)


def test_histogram_quantile_follows_prometheus_rules():
    buckets = {0.1: 10.0, 0.5: 20.0, math.inf: 20.0}
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.05)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.99, {0.1: 1.0, math.inf: 10.0}) == pytest.approx(0.1)
    assert histogram_quantile(0.5, {math.inf: 0.0}) is None


def test_prometheus_parser_keeps_labels_apart():
    samples = parse_prometheus_text(
        'a_total{route="/x",status="200"} 3\na_total{route="/x",status="429"} 1\n'
        'b{msg="has \\"quotes\\", and commas"} 2.5 1700000000\n'
    )
    assert samples[("a_total", (("route", "/x"), ("status", "200")))] == 3.0
    assert samples[("a_total", (("route", "/x"), ("status", "429")))] == 1.0
    assert len(samples) == 3


def test_soak_median_rss_growth_compares_the_minute_after_warmup_with_the_last():
    from loadtest.soak import median_rss_growth_pct

    def swinging(start: int, stop: int, low: float, high: float) -> list[dict]:
        return [
            {"t_s": float(t), "rss_mb": low if (t // 5) % 2 else high}
            for t in range(start, stop, 5)
        ]

    samples = [{"t_s": float(t), "rss_mb": 50.0} for t in range(0, 60, 5)]  # warm-up
    samples += swinging(60, 120, 100.0, 120.0)  # median 110
    samples += [{"t_s": float(t), "rss_mb": 115.0} for t in range(120, 245, 5)]
    samples += swinging(245, 305, 110.0, 130.0)  # the last minute: median 120
    assert median_rss_growth_pct(samples, warmup_s=60) == 9.09  # 100 x 10 / 110
    assert median_rss_growth_pct(samples[:30], warmup_s=60) is None  # no two separate minutes
