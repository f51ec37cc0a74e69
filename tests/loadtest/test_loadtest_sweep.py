"""The sweep's rates and its stop rule, on synthetic summaries."""

from __future__ import annotations

import math

import pytest

from loadtest.sweep import judge_step, run_sweep, sweep_rates


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
