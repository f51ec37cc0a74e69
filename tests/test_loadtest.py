"""The load-test tooling's pure parts: input sampling, the Poisson schedule, percentile and
report math, the sweep's stop rule, and the open-loop sender's independence from responses.

No assertion here depends on how fast the machine is: the sender tests check recorded
offsets against the schedule and the order of events, with wide tolerances.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from loadtest.client import (
    REPO_ROOT,
    STATUS_DROPPED,
    RequestRecord,
    check_target,
    is_loopback_url,
    parse_prometheus_text,
    send_translate,
    spawned_server,
)
from loadtest.closed_loop import run_closed_loop
from loadtest.inputs import CATEGORIES, HELP_PARAGRAPHS, UI_STRINGS, InputSampler, parse_weights
from loadtest.open_loop import poisson_schedule, run_open_loop
from loadtest.report import (
    histogram_quantile,
    percentile,
    server_metrics_delta,
    summarize,
    timeline_point,
)
from loadtest.sweep import judge_step, run_sweep, sweep_rates

URL = "http://loadtest.invalid"  # MockTransport: nothing leaves the process


def ok_record(
    index: int, latency_s: float, *, scheduled_s: float = 0.0, tokens: int = 3
) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_s=scheduled_s,
        sent_s=scheduled_s,
        latency_s=latency_s,
        status=200,
        output_chars=10,
        output_tokens=tokens,
    )


# --- inputs -------------------------------------------------------------------------------


def test_input_pool_has_about_150_distinct_strings():
    assert len(set(UI_STRINGS)) == len(UI_STRINGS) >= 90
    assert len(set(HELP_PARAGRAPHS)) == len(HELP_PARAGRAPHS) >= 40
    assert all(len(p) > 100 and p.count(". ") >= 1 for p in HELP_PARAGRAPHS)


def test_sampler_is_deterministic_for_a_seed_and_differs_across_seeds():
    a = InputSampler(seed=7)
    b = InputSampler(seed=7)
    c = InputSampler(seed=8)
    seq_a = [a.next_payload() for _ in range(50)]
    assert seq_a == [b.next_payload() for _ in range(50)]
    assert seq_a != [c.next_payload() for _ in range(50)]


def test_sampler_follows_the_category_weights():
    sampler = InputSampler(seed=1, weights={"ui": 0.8, "help": 0.2})
    help_texts = set(HELP_PARAGRAPHS)
    draws = [sampler.next_text() for _ in range(4000)]
    help_share = sum(text in help_texts for text in draws) / len(draws)
    assert help_share == pytest.approx(0.2, abs=0.03)
    only_ui = InputSampler(seed=1, weights={"ui": 1.0, "help": 0.0})
    assert all(only_ui.next_text() in UI_STRINGS for _ in range(200))


def test_payload_carries_lists_and_decoding_options():
    payload = InputSampler(
        seed=0, texts_per_request=3, beam_size=4, max_new_tokens=32
    ).next_payload()
    assert isinstance(payload["text"], list) and len(payload["text"]) == 3
    assert payload["beam_size"] == 4 and payload["max_new_tokens"] == 32
    assert set(InputSampler(seed=0).next_payload()) == {"text"}


def test_mix_parsing_rejects_unknown_categories():
    assert parse_weights("ui=0.6, help=0.4") == {"ui": 0.6, "help": 0.4}
    with pytest.raises(ValueError):
        parse_weights("poetry=1")
    with pytest.raises(ValueError):
        InputSampler(weights={"ui": 0.0, "help": 0.0})
    assert set(CATEGORIES) == {"ui", "help"}


# --- Poisson schedule ---------------------------------------------------------------------


def test_poisson_schedule_mean_interarrival_matches_the_rate():
    rate = 5.0
    offsets = poisson_schedule(rate, count=4000, seed=3)
    gaps = np.diff([0.0, *offsets])
    assert len(offsets) == 4000
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    # Exponential gaps: standard deviation equals the mean.
    assert gaps.std() == pytest.approx(1 / rate, rel=0.1)
    assert all(b > a for a, b in zip(offsets, offsets[1:], strict=False))


def test_poisson_schedule_is_reproducible_and_bounded_by_duration():
    assert poisson_schedule(2.0, duration_s=30, seed=1) == poisson_schedule(
        2.0, duration_s=30, seed=1
    )
    offsets = poisson_schedule(10.0, duration_s=60, seed=2)
    assert offsets[-1] <= 60
    assert len(offsets) == pytest.approx(600, rel=0.15)
    assert len(poisson_schedule(10.0, duration_s=60, count=25, seed=2)) == 25
    with pytest.raises(ValueError):
        poisson_schedule(1.0)


# --- percentiles and the report -----------------------------------------------------------


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


# --- sweep stop rule ----------------------------------------------------------------------


def synthetic_summary(rate: float, capacity: float = 10.0, service_ms: float = 100.0) -> dict:
    """An M/M/1-like service: latency grows as 1/(1 - utilisation); beyond capacity it fails."""
    if rate >= capacity:
        return {"error_rate": 0.5, "latency_ms": {"p99": 30_000.0}}
    p99 = service_ms * math.log(100) / (1 - rate / capacity)
    return {"error_rate": 0.0, "latency_ms": {"p99": p99}}


def test_sweep_stops_at_the_first_rate_over_the_slo():
    rates = sweep_rates(1.0, growth=1.5, increment=None, max_rate=100, max_steps=12)
    measured: list[float] = []

    def measure(rate: float) -> dict:
        measured.append(rate)
        return synthetic_summary(rate)

    # p99 = 460.5 / (1 - rate/10) ms; it exceeds 1000 ms above rate 5.395.
    outcome = run_sweep(rates, measure, slo_p99_ms=1000.0, max_error_rate=0.01)
    assert measured == [1.0, 1.5, 2.25, 3.375, 5.0625, 7.5938]
    assert outcome.max_sustainable_rate == pytest.approx(5.0625)
    assert not outcome.steps[-1].passed and "p99" in outcome.steps[-1].reason
    assert all(step.passed for step in outcome.steps[:-1])


def test_sweep_stops_on_errors_even_when_latency_is_fine():
    rates = sweep_rates(2.0, growth=2, increment=None, max_rate=64, max_steps=10)
    outcome = run_sweep(
        rates, lambda r: synthetic_summary(r, capacity=5.0), slo_p99_ms=1e9, max_error_rate=0.01
    )
    assert outcome.max_sustainable_rate == 4.0
    assert "error rate" in outcome.steps[-1].reason


def test_sweep_reports_none_when_the_first_step_fails_and_respects_the_time_budget():
    outcome = run_sweep([20.0, 30.0], synthetic_summary, slo_p99_ms=1000, max_error_rate=0.01)
    assert outcome.max_sustainable_rate is None and len(outcome.steps) == 1
    budget = iter([100.0, 100.0, 5.0])
    outcome = run_sweep(
        [1.0, 2.0, 3.0], synthetic_summary, slo_p99_ms=1e9, max_error_rate=0.01,
        time_left_s=lambda: next(budget), step_cost_s=50.0,
    )  # fmt: skip
    assert outcome.max_sustainable_rate == 2.0 and "time budget" in outcome.stop_reason
    assert not judge_step(
        1.0, {"error_rate": 0.0, "latency_ms": {"p99": None}}, slo_p99_ms=1, max_error_rate=0
    ).passed


def test_sweep_rates_grow_geometrically_or_linearly_within_bounds():
    assert sweep_rates(1.0, growth=2.0, increment=None, max_rate=10, max_steps=10) == [
        1.0,
        2.0,
        4.0,
        8.0,
    ]
    assert sweep_rates(1.0, growth=2.0, increment=0.5, max_rate=10, max_steps=3) == [1.0, 1.5, 2.0]


# --- the open-loop sender does not wait on responses --------------------------------------


def gated_transport(
    expected: int, release_timeout_s: float = 10.0
) -> tuple[httpx.MockTransport, dict]:
    """A mock service whose handler holds every request until ``expected`` requests have
    arrived (or the timeout passes). A sender that waited on responses would deliver one
    request at a time and every response would be released by the timeout instead."""
    state = {"arrived": 0, "released_by_gate": 0, "released_by_timeout": 0}
    gate = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        state["arrived"] += 1
        if state["arrived"] >= expected:
            gate.set()
        try:
            await asyncio.wait_for(gate.wait(), release_timeout_s)
            state["released_by_gate"] += 1
        except TimeoutError:
            state["released_by_timeout"] += 1
            gate.set()  # the verdict is in; don't make a broken sender pay the timeout per request
        return httpx.Response(
            200,
            json={
                "translations": [{"text": "ok", "tokens": 1, "sentences": 1}],
                "usage": {"output_tokens": 1},
            },
        )

    return httpx.MockTransport(handler), state


def test_open_loop_sends_on_schedule_while_responses_are_held_back():
    schedule = [
        0.02 * i for i in range(15)
    ]  # 15 arrivals over 0.28 s; nothing returns before all arrive
    transport, state = gated_transport(expected=len(schedule))

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=transport) as client:
            return await run_open_loop(
                client, URL, schedule, InputSampler(seed=0), max_in_flight=64
            )

    records = asyncio.run(scenario())
    assert state["released_by_gate"] == len(schedule) and state["released_by_timeout"] == 0
    assert [r.scheduled_s for r in records] == schedule
    assert all(r.ok for r in records)
    # Sent at (not before, and not long after) the scheduled offsets; generous for a busy box.
    lags = [r.sent_s - r.scheduled_s for r in records]
    assert min(lags) >= -0.005
    assert statistics.median(lags) < 0.5
    # Latency counts from the schedule: every request waited for the last arrival.
    assert all(r.completed_s >= schedule[-1] - 0.005 for r in records)


def test_latency_counts_from_the_scheduled_time_when_the_sender_is_late():
    async def instant(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"translations": [{"text": "x"}], "usage": {"output_tokens": 4}}
        )

    async def scenario() -> RequestRecord:
        async with httpx.AsyncClient(transport=httpx.MockTransport(instant)) as client:
            record = RequestRecord(index=0, scheduled_s=0.0)
            # The run "started" 1 s ago and this request was due then: it is sent 1 s late.
            run_start = time.perf_counter() - 1.0
            return await send_translate(client, URL, {"text": "Save changes"}, record, run_start)

    record = asyncio.run(scenario())
    assert record.ok and record.output_tokens == 4 and record.input_chars == len("Save changes")
    assert record.sent_s >= 1.0 and record.latency_s >= record.sent_s


def test_open_loop_drops_arrivals_beyond_the_in_flight_cap():
    schedule = [0.0] * 6  # all due at once: the sender never yields before creating them

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return httpx.Response(200, json={"translations": [{"text": "x"}]})

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as client:
            return await run_open_loop(client, URL, schedule, InputSampler(seed=0), max_in_flight=3)

    records = asyncio.run(scenario())
    assert [r.dropped for r in records] == [False] * 3 + [True] * 3
    assert all(r.ok for r in records[:3])
    assert summarize(records, duration_s=1.0)["by_status"] == {"200": 3, "dropped": 3}


def test_the_generators_default_cap_is_above_the_services_in_flight_limit():
    """Under overload the service's admission control, not the generator's cap, must decide
    who is refused (loadtest/open_loop.py's docstring)."""
    from loadtest.open_loop import DEFAULT_MAX_IN_FLIGHT
    from service.config import AccessSettings

    assert AccessSettings.model_fields["max_inflight_requests"].default < DEFAULT_MAX_IN_FLIGHT


def test_open_loop_records_errors_without_raising():
    async def failing(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/translate":
            return httpx.Response(404)
        if b"Save" in request.content:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(429, headers={"Retry-After": "2"}, json={"error": "queue full"})

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(failing)) as client:
            return await run_open_loop(client, URL, [0.0] * 20, InputSampler(seed=0))

    records = asyncio.run(scenario())
    statuses = {r.status for r in records}
    assert statuses <= {0, 429} and 429 in statuses
    assert all(r.retry_after_s == 2.0 for r in records if r.status == 429)
    assert all(r.error for r in records)


def test_closed_loop_keeps_at_most_concurrency_requests_outstanding():
    state = {"now": 0, "peak": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return httpx.Response(200, json={"translations": [{"text": "x", "tokens": 2}]})

    async def scenario() -> list[RequestRecord]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await run_closed_loop(
                client, URL, InputSampler(seed=0), concurrency=3, max_requests=12
            )

    records = asyncio.run(scenario())
    assert len(records) == 12 and all(r.ok for r in records)
    assert state["peak"] == 3
    assert [r.index for r in records] == list(range(12))
    assert all(r.output_tokens == 2 for r in records)


# --- target safety and the spawned server --------------------------------------------------


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


def test_only_loopback_targets_are_allowed_by_default():
    assert is_loopback_url("http://127.0.0.1:8000") and is_loopback_url("http://localhost:1")
    assert is_loopback_url("http://[::1]:8000")
    assert not is_loopback_url("http://10.0.0.5:8000") and not is_loopback_url(
        "https://example.com"
    )
    with pytest.raises(SystemExit):
        check_target("http://example.com", allow_remote=False)
    check_target("http://example.com", allow_remote=True)


def test_spawned_stub_server_serves_a_short_closed_loop_and_stops(tmp_path):
    command = [sys.executable, "-m", "loadtest.stub_server", "--port", "{port}", "--base-ms", "1"]
    with spawned_server(
        None, command=command, ready_timeout_s=60, log_path=tmp_path / "stub.log"
    ) as url:
        assert url.startswith("http://127.0.0.1:")

        async def scenario() -> list[RequestRecord]:
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                return await run_closed_loop(
                    client, url, InputSampler(seed=0), concurrency=2, max_requests=6
                )

        records = asyncio.run(scenario())
    assert [r.status for r in records] == [200] * 6
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/ready", timeout=2, trust_env=False)


def test_a_run_ended_by_sigterm_stops_the_server_it_spawned():
    """``kill`` of a load run (what ``python -m loadtest`` sets up): the spawned server is
    stopped, not left running beside the next measurement."""
    stub = [sys.executable, "-m", "loadtest.stub_server", "--port", "{port}", "--base-ms", "1"]
    script = (
        "import sys, time\n"
        "from loadtest.client import exit_on_sigterm, spawned_process\n"
        "exit_on_sigterm()\n"
        f"with spawned_process(None, command={stub!r}, ready_timeout_s=60) as (url, server):\n"
        "    print(server.pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        server_pid = int(run.stdout.readline())
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # stopped and reaped, not orphaned
            os.kill(server_pid, 0)
    finally:
        run.kill()


def test_raw_client_runs_the_same_loops_and_survives_closed_keep_alive_connections(tmp_path):
    from loadtest.client import spawned_process
    from loadtest.process_stats import ProcessSampler, cpu_split, thread_cpu_seconds
    from loadtest.raw_http import RawClient

    command = [sys.executable, "-m", "loadtest.stub_server", "--port", "{port}", "--base-ms", "1"]
    with spawned_process(None, command=command, ready_timeout_s=60) as (url, process):

        async def scenario() -> tuple[list[RequestRecord], int]:
            async with RawClient(url, max_connections=2, timeout_s=10) as client:
                records = await run_closed_loop(
                    client, url, InputSampler(seed=0), concurrency=2, max_requests=6
                )
                # A pooled connection the server has closed meanwhile is retried, not an error.
                for connection in client._free:
                    connection.writer.transport.abort()
                again = await client.post(url + "/v1/translate", json={"text": "Save"})
                return records, again.status_code

        before = thread_cpu_seconds(process.pid)
        records, status_after_close = asyncio.run(scenario())
        sampler = ProcessSampler(process.pid)
        sampler.sample(started=0.0)
        split = cpu_split(process.pid, before, thread_cpu_seconds(process.pid))
    assert [r.status for r in records] == [200] * 6
    assert all(r.output_chars > 0 for r in records)
    assert status_after_close == 200
    assert sampler.samples[0]["rss_mb"] > 0 and sampler.samples[0]["fds"] > 0
    assert split["threads"] >= 1 and split["loop_cpu_s"] >= 0


def test_compare_splits_latency_by_answer_length():
    from loadtest.compare_batching import SHORT_OUTPUT_TOKENS, latency_by_length

    records = [
        ok_record(0, 0.010, tokens=SHORT_OUTPUT_TOKENS),
        ok_record(1, 0.030, tokens=3),
        ok_record(2, 0.200, tokens=SHORT_OUTPUT_TOKENS + 1),
        RequestRecord(index=3, scheduled_s=0.0, sent_s=0.0, latency_s=9.0, status=429),
    ]
    split = latency_by_length(records)
    assert split["short"]["requests"] == 2 and split["long"]["requests"] == 1
    assert split["long"]["latency_ms"]["p50"] == pytest.approx(200.0)  # the 429 is not counted
    assert split["short"]["latency_ms"]["max"] == pytest.approx(30.0)


def test_interleaved_plan_covers_the_schedule_once_and_alternates_the_order():
    from loadtest.compare_batching import POLICIES, interleaved_plan

    schedule = [0.1, 0.9, 1.0, 2.5, 3.99, 4.0]
    plan = interleaved_plan(schedule, duration_s=4.0, segments=4)
    assert [start for start, _, _ in plan] == [0.0, 1.0, 2.0, 3.0]
    assert [indices for _, indices, _ in plan] == [[0, 1], [2], [3], [4, 5]]  # the end: last
    assert [order for _, _, order in plan] == [POLICIES, POLICIES[::-1]] * 2
    assert interleaved_plan(schedule, 4.0, 1) == [(0.0, list(range(6)), POLICIES)]
    with pytest.raises(ValueError, match="segments"):
        interleaved_plan(schedule, 4.0, 0)


def test_interleaved_compare_sends_every_arrival_to_both_services_with_the_same_inputs(
    tmp_path, capsys
):
    import re

    from loadtest.compare_batching import main as compare_main

    stub = f"{sys.executable} -m loadtest.stub_server --port {{port}} --base-ms 1"
    argv = ["--spawn-server", "unused", "--server-command", stub, "--rate", "20"]
    argv += ["--duration", "2", "--interleave", "2", "--warmup", "1", "--no-plot"]
    assert compare_main(argv + ["--results-dir", str(tmp_path), "--name", "mixed"]) == 0

    warmed = re.findall(r"(\w+): warmed up, (\d+)/(\d+) ok", capsys.readouterr().out)
    assert sorted(policy for policy, _, _ in warmed) == ["continuous", "static"]
    assert all(int(ok) == int(sent) > 0 for _, ok, sent in warmed)
    document = json.loads((tmp_path / "mixed.json").read_text())
    assert document["config"]["interleave"] == 2
    assert document["config"]["warmup_s"] == 1
    runs = document["runs"]
    schedule = poisson_schedule(20, duration_s=2, seed=0)
    for policy in ("continuous", "static"):
        records = runs[policy]["records"]
        assert [r["index"] for r in records] == list(range(len(schedule)))
        assert [r["scheduled_s"] for r in records] == schedule
        assert all(r["status"] == 200 for r in records)
        assert runs[policy]["summary"]["requests"] == len(schedule)
        # sent on the schedule's clock: the sender's lag is small and never negative (each
        # segment's own clock started at its window, seconds after the schedule's)
        lag = runs[policy]["summary"]["sender_lag_ms"]
        assert 0 <= lag["p50"] <= lag["max"] < 500, lag
        # the warm-up's texts reached the service before its counters were read: not counted
        assert runs[policy]["summary"]["server"]["queue_wait"]["count"] == len(schedule)
    inputs = [[r["input_chars"] for r in runs[policy]["records"]] for policy in runs]
    assert inputs[0] == inputs[1] and len(set(inputs[0])) > 1


def test_a_control_arm_is_a_second_static_batcher_loaded_in_rotation(tmp_path, capsys):
    import re

    from loadtest.compare_batching import (
        CONTROL,
        POLICIES,
        interleaved_plan,
        policy_env,
        policy_of,
    )
    from loadtest.compare_batching import main as compare_main

    arms = (*POLICIES, CONTROL)
    plan = interleaved_plan([0.5, 1.5, 2.5, 3.5], duration_s=4.0, segments=4, arms=arms)
    orders = [order for _, _, order in plan]
    assert orders == [arms, arms[1:] + arms[:1], arms[2:] + arms[:2], arms]  # each first once
    from loadtest.compare_batching import arm_env, build_parser

    args = build_parser().parse_args(
        ["--control", "continuous", "--server-env", "MT_A=1", "--arm-env", "control:MT_B=2"]
    )
    assert policy_of(CONTROL, args) == "continuous"
    control_env = policy_env(policy_of(CONTROL, args), 10.0, arm_env(args, CONTROL))
    assert control_env["MT_BATCHING"] == "continuous"
    assert control_env["MT_A"] == "1" and control_env["MT_B"] == "2"
    assert "MT_B" not in arm_env(args, "continuous")
    args = build_parser().parse_args(["--control"])
    assert policy_of(CONTROL, args) == "static"
    for malformed in ("control", "control:MT_B", ":MT_B=2", "control:=2"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--control", "--arm-env", malformed])
    with pytest.raises(SystemExit):  # no such arm in this run
        compare_main(["--arm-env", "control:MT_B=2", "--spawn-server", "unused"])

    stub = f"{sys.executable} -m loadtest.stub_server --port {{port}} --base-ms 1"
    argv = ["--spawn-server", "unused", "--server-command", stub, "--rate", "20", "--control"]
    argv += ["--duration", "1.5", "--interleave", "3", "--warmup", "0.5", "--no-plot"]
    assert compare_main(argv + ["--results-dir", str(tmp_path), "--name", "aa"]) == 0
    out = capsys.readouterr().out
    warmed = re.findall(r"(\w+): warmed up", out)
    assert sorted(warmed) == ["continuous", "control", "static"]
    document = json.loads((tmp_path / "aa.json").read_text())
    assert document["config"]["control"] == "static"
    schedule = poisson_schedule(20, duration_s=1.5, seed=0)
    for arm in arms:
        assert [r["index"] for r in document["runs"][arm]["records"]] == list(range(len(schedule)))
    p99 = document["comparison"]["p99_ms"]
    assert p99["control/static"] == pytest.approx(p99[CONTROL] / p99["static"], abs=1e-3)
    assert "control/static" in out


def test_shapes_report_puts_the_a_a_beside_the_a_b(tmp_path, capsys):
    from loadtest.shapes_report import main as shapes_main

    def cell(cont: tuple, static: tuple, control: tuple) -> dict:
        result = _compare_result(cont, static)
        result["runs"]["control"] = _compare_result(control, static)["runs"]["continuous"]
        for run in result["runs"].values():
            run["summary"]["by_status"] = {}
        return {**result, "config": {"rate": 85.0, "control": "static"}}

    cells = {  # (p50, p99, req/s) continuous, static, control
        "1core-load85-run1.json": ((90, 300, 85.0), (100, 320, 85.0), (95, 340, 85.0)),
        "1core-load85-run2.json": ((110, 310, 85.0), (100, 300, 85.0), (97, 290, 85.0)),
        "1core-load50-run1.json": ((40, 150, 50.0), (45, 160, 50.0), (45, 160, 50.0)),
    }
    for name, (cont, static, control) in cells.items():
        (tmp_path / name).write_text(json.dumps(cell(cont, static, control)))
    assert shapes_main([str(tmp_path)]) == 1  # run 2 at 85 % is above static
    summary = json.loads((tmp_path / "summary.json").read_text())
    verdicts = {(c["load_pct"], c["run"]): c["control_wins"] for c in summary["cells"]}
    assert verdicts == {(85, 1): False, (85, 2): True, (50, 1): True}  # equal counts as at
    control = {load["load_pct"]: load for load in summary["controls"]}
    assert control[85]["at_or_below"] == 1 and control[85]["runs"] == 2
    assert control[85]["p99"]["min"] == pytest.approx(290 / 300, abs=1e-3)
    row = "| 1core | 85 % | 2 | 1, 1 | 1.00, 0.90–1.10; 0.96, 0.95–0.97 | 0.98, 0.94–1.03; 1.01, 0.97–1.06 |"
    assert row in capsys.readouterr().out


def test_the_generators_client_keeps_one_raw_client_per_service_and_httpx_for_https():
    import httpx

    from loadtest.raw_http import RawClient, RawClients

    clients = RawClients(max_connections=4, timeout_s=1.0)
    first = clients._for("http://127.0.0.1:8001/v1/translate")
    assert isinstance(first, RawClient) and (first.host, first.port) == ("127.0.0.1", 8001)
    assert clients._for("http://127.0.0.1:8001/metrics") is first
    assert clients._for("http://127.0.0.1:8002/metrics") is not first
    assert isinstance(clients._for("https://mt.example.com/v1/translate"), httpx.AsyncClient)
    asyncio.run(clients.aclose())


# --- the machine a result was measured on ------------------------------------------------

AVX2_ONLY_CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
processor\t: 1
flags\t\t: fpu sse sse2 avx512f
"""


def test_simd_flags_are_the_kernel_deciding_ones_of_the_first_processor():
    from loadtest.machine import cpu_model, simd_flags

    assert simd_flags(AVX2_ONLY_CPUINFO) == ["avx", "avx2", "fma"]
    assert cpu_model(AVX2_ONLY_CPUINFO) == "AMD EPYC 7B13"
    assert simd_flags("processor\t: 0\n") == []


def test_every_result_json_records_the_machine(tmp_path):
    import re
    from pathlib import Path

    from loadtest.report import write_json

    path = write_json(tmp_path / "run.json", {"kind": "open_loop", "summary": {"ok": 3}})
    document = json.loads(path.read_text())
    assert document["kind"] == "open_loop" and document["summary"] == {"ok": 3}
    machine = document["machine"]
    assert machine["logical_cpus"] >= 1 and machine["cpu"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # the flags as grep would find them on this machine
        first = re.search(r"^flags\s*:(.*)$", cpuinfo.read_text(), re.MULTILINE)
        expected = sorted({f for f in first.group(1).split() if re.match(r"(avx|fma|amx)", f)})
        assert machine["simd"] == expected
    # a document that names its machine keeps it
    kept = write_json(tmp_path / "own.json", {"machine": {"cpu": "given"}})
    assert json.loads(kept.read_text())["machine"] == {"cpu": "given"}


def test_the_server_runs_under_taskset_and_the_generator_is_pinned_elsewhere(monkeypatch):
    import argparse

    from loadtest.client import cpu_list, pin_client, server_command

    assert cpu_list("0,2-3") == {0, 2, 3}
    with pytest.raises(SystemExit, match="not a CPU list"):
        cpu_list("zero")
    args = argparse.Namespace(server_command=None, server_cpus="0", client_cpus="1")
    command = server_command(args)
    assert command[:3] == ["taskset", "-c", "0"] and "{port}" in command
    assert command[3:6] == [sys.executable, "-m", "service"]
    pinned: list[set[int]] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append(set(cpus)))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})
    pin_client(args)
    assert pinned == [{1}]
    no_pinning = argparse.Namespace(server_command="stub {port}", server_cpus=None)
    assert server_command(no_pinning) == ["stub", "{port}"]


def _compare_result(cont: tuple[float, float, float], static: tuple[float, float, float]) -> dict:
    def run(p50: float, p99: float, rps: float) -> dict:
        summary = {"latency_ms": {"p50": p50, "p99": p99}, "throughput_rps": rps, "failed": 0}
        return {"summary": summary}

    return {"runs": {"continuous": run(*cont), "static": run(*static)}}


def test_paired_report_takes_each_ratio_within_its_pair(tmp_path):
    from loadtest.paired_report import main as paired_main

    cells = {  # (continuous p50, p99, req/s), (static p50, p99, req/s)
        "A-load85-seed1.json": ((80, 400, 99), (100, 500, 100)),
        "A-load85-seed2.json": ((90, 660, 100), (100, 600, 100)),
        "B-load85-seed1.json": ((120, 300, 101), (100, 400, 100)),
        "B-load85-seed2.json": ((50, 200, 100), (100, 400, 100)),
    }
    for name, (cont, static) in cells.items():
        (tmp_path / name).write_text(json.dumps(_compare_result(cont, static)))
    (tmp_path / "capacity0.json").write_text("{}")  # not a cell: left out
    assert paired_main([str(tmp_path)]) == 0
    arms = {row["arm"]: row for row in json.loads((tmp_path / "paired.json").read_text())["arms"]}
    a, b = arms["A"], arms["B"]
    assert a["seeds"] == b["seeds"] == 2
    assert a["p99"] == {"mean": 0.95, "median": 0.95, "min": 0.8, "max": 1.1, "at_or_below_1": 1}
    assert a["p50"]["mean"] == 0.85 and a["throughput"]["mean"] == 0.995
    assert b["p99"]["mean"] == 0.625 and b["p99"]["at_or_below_1"] == 2
    assert b["p50"]["at_or_below_1"] == 1  # 1.2 and 0.5


def test_shapes_report_judges_every_cell_and_finds_the_capacity(tmp_path, capsys):
    from loadtest.shapes_report import main as shapes_main

    def cell(cont: tuple, static: tuple, rate: float) -> dict:
        result = _compare_result(cont[:3], static[:3])
        for policy, unserved in (("continuous", cont[3]), ("static", static[3])):
            result["runs"][policy]["summary"]["by_status"] = {"200": 1000, **unserved}
            result["runs"][policy]["summary"]["failed"] = sum(unserved.values())
        return {**result, "config": {"rate": rate}}

    cells = {  # (p50, p99, req/s, not served) continuous, static; the rate sent
        "1core-load50-run1.json": ((40, 150, 50.0, {}), (45, 160, 50.0, {}), 50.0),
        "1core-load85-run1.json": ((90, 300, 85.0, {}), (80, 310, 85.0, {}), 85.0),  # p50 above
        "1core-load95-run1.json": (  # static's generator dropped more: at or below all the same
            (95, 320, 95.0, {"dropped": 5}),
            (99, 330, 94.0, {"dropped": 40, "429": 1}),
            95.0,
        ),
        "2shared-load85-run1.json": ((60, 200, 169.5, {}), (150, 380, 170.0, {}), 170.0),
        # lower latencies, but more requests left unserved (drops count as 429s do)
        "2shared-load95-run1.json": (
            (70, 250, 190.0, {"429": 2, "dropped": 1}),
            (160, 400, 180.0, {"429": 2}),
            190.0,
        ),
    }
    for name, (cont, static, rate) in cells.items():
        (tmp_path / name).write_text(json.dumps(cell(cont, static, rate)))
    (tmp_path / "1core-capacity.json").write_text(
        json.dumps({"summary": {"throughput_rps": 101.5}})
    )
    assert shapes_main([str(tmp_path)]) == 1  # not every cell at or below
    summary = json.loads((tmp_path / "summary.json").read_text())
    # measured for one core; for two cores (CAPACITY, no closed loop) from the cells' rates
    assert summary["capacity_rps"] == {"1core": 101.5, "2shared": 200.0}
    verdicts = {(c["shape"], c["load_pct"]): c["continuous_wins"] for c in summary["cells"]}
    assert verdicts == {
        ("1core", 50): True,
        ("1core", 85): False,
        ("1core", 95): True,
        ("2shared", 85): True,  # 0.3 % less throughput is within the 1 % allowed
        ("2shared", 95): False,
    }
    table = capsys.readouterr().out
    assert (
        "| 2shared (200.0 req/s) | 95 % | 1 | 70 / 250 | 160 / 400 | 190.0 / 180.0 | 3 / 2 (1 / 0) | NO |"
        in table
    )
    assert "| 5 / 41 (5 / 40) | yes |" in table


def test_shapes_report_sums_up_each_load_over_its_runs(tmp_path, capsys):
    from loadtest.shapes_report import main as shapes_main

    def cell(cont_ms: list[float], static_ms: list[float]) -> dict:
        runs = {}
        for policy, latencies in (("continuous", cont_ms), ("static", static_ms)):
            records = [{"status": 200, "latency_s": ms / 1000} for ms in latencies]
            records.append({"status": 429, "latency_s": 0.001})  # shed: not a latency
            ordered = sorted(latencies)
            runs[policy] = {
                "summary": {
                    "latency_ms": {"p50": ordered[len(ordered) // 2], "p99": ordered[-1]},
                    "throughput_rps": 100.0,
                    "by_status": {"429": 1},
                    "failed": 1,
                },
                "records": records,
            }
        return {"runs": runs, "config": {"rate": 85.0}}

    # run 1: continuous lower at both quantiles; run 2: its p99 higher
    (tmp_path / "1core-load85-run1.json").write_text(
        json.dumps(cell([10, 20, 30, 40, 100], [20, 40, 60, 80, 200]))
    )
    (tmp_path / "1core-load85-run2.json").write_text(
        json.dumps(cell([10, 20, 30, 40, 300], [20, 40, 60, 80, 150]))
    )
    assert shapes_main([str(tmp_path)]) == 1  # run 2 is not at or below
    (load,) = json.loads((tmp_path / "summary.json").read_text())["loads"]
    assert (load["shape"], load["load_pct"], load["runs"], load["at_or_below"]) == (
        "1core",
        85,
        2,
        1,
    )
    assert load["p50"]["mean"] == 0.5  # 30/60 in both runs
    assert load["p99"]["min"] == 0.5 and load["p99"]["max"] == 2.0
    assert load["p99"]["at_or_below_1"] == 1
    # pooled: the ten successful latencies of each policy (the 429s left out)
    assert load["pooled_ms"]["continuous"] == {"p50": 30.0, "p99": 282.0}
    assert load["pooled_ms"]["static"] == {"p50": 60.0, "p99": 195.5}
    assert "| 1core | 85 % | 2 | 1 | 0.50, 0.50–0.50 | 1.25, 0.50–2.00 | 30 / 60 | 282 / 196 |" in (
        capsys.readouterr().out
    )


def test_paired_cores_script_parses():
    script = Path(__file__).resolve().parents[1] / "loadtest" / "paired_cores.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_tail_report_tells_an_arms_own_slow_episode_from_a_burst_every_arm_had(tmp_path, capsys):
    """Two arms, the same 30 s of arrivals (10 a second, 10 ms each): both are slow for the
    burst at 20 s; only continuous is slow at 5 s. Its slowest 1 % (three requests) fall in
    both; static's (three) in the burst alone."""
    from loadtest.tail_report import main as tail_main

    def records(slow: dict[float, float]) -> list[dict]:
        out = []
        for index in range(300):
            at = index / 10
            latency = slow.get(round(at, 1), 0.010)
            out.append({"index": index, "scheduled_s": at, "latency_s": latency, "status": 200})
        return out

    runs = {
        "continuous": {"records": records({5.0: 0.9, 5.1: 0.8, 20.0: 0.6, 20.1: 0.5})},
        "static": {"records": records({5.0: 0.02, 20.0: 0.7, 20.1: 0.6, 20.2: 0.5})},
    }
    document = {"config": {"duration_s": 30.0}, "runs": runs}
    (tmp_path / "1core-load85-run1.json").write_text(json.dumps(document))
    (tmp_path / "summary.json").write_text("{}")  # shapes_report's: not a cell
    assert tail_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    own = "5.0-5.1 s, 2 slow, 10 arrivals in the second before, slowest continuous 900 / static 20"
    assert own + " ms: its own" in out
    shared = "20.0-20.0 s, 1 slow, 10 arrivals in the second before, slowest continuous 600 / "
    assert shared + "static 700 ms\n" in out
    assert "continuous: 2 of its 3 slowest requests in episodes of its own" in out
    assert "static: 0 of its 3 slowest requests in episodes of its own" in out


def test_control_code_serves_the_control_arm_from_another_checkout(tmp_path, capsys):
    """An A/B of code in one run: the control's service starts in the other checkout (here a
    stand-in whose stub marks that it ran there), the other two in this one."""
    from loadtest.compare_batching import main as compare_main

    checkout = tmp_path / "checkout"
    (checkout / "service").mkdir(parents=True)
    (checkout / "loadtest").mkdir()
    (checkout / "loadtest" / "__init__.py").write_text("")
    real_stub = Path(__file__).resolve().parents[1] / "loadtest" / "stub_server.py"
    (checkout / "loadtest" / "stub_server.py").write_text(
        "import pathlib, runpy\n"
        "pathlib.Path('served-here').write_text('yes')\n"
        f"runpy.run_path({str(real_stub)!r}, run_name='__main__')\n"
    )
    stub = f"{sys.executable} -m loadtest.stub_server --port {{port}} --base-ms 1"
    argv = ["--spawn-server", "unused", "--server-command", stub, "--rate", "20", "--control"]
    argv += ["--duration", "1", "--interleave", "2", "--warmup", "0", "--no-plot"]
    argv += ["--results-dir", str(tmp_path / "out"), "--name", "code"]
    assert compare_main([*argv, "--control-code", str(checkout)]) == 0
    assert (checkout / "served-here").read_text() == "yes"
    assert not (Path(__file__).resolve().parents[1] / "served-here").exists()
    document = json.loads((tmp_path / "out" / "code.json").read_text())
    assert document["config"]["control_code"] == {"path": str(checkout.resolve()), "revision": None}
    assert all(r["status"] == 200 for r in document["runs"]["control"]["records"])
    with pytest.raises(SystemExit):  # no arm to serve it without --control
        compare_main(["--spawn-server", "unused", "--control-code", str(checkout)])
    with pytest.raises(SystemExit):  # not a checkout of the service
        compare_main(["--spawn-server", "unused", "--control", "--control-code", str(tmp_path)])
