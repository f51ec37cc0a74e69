"""Capacity sweep: raise the open-loop arrival rate step by step until the service misses
its latency objective, and report the highest rate it sustained.

Each step is an open-loop Poisson run (``loadtest.open_loop``) of ``--step-duration``
seconds. A step passes when its p99 latency (from the scheduled send time, 200s only) is
at most ``--slo-p99-ms`` and its failure rate (non-200 answers, transport errors and
arrivals dropped at the in-flight cap) is at most ``--max-error-rate``. The sweep stops at
the first failing step; the highest sustainable rate is the last passing one.

    .venv/bin/python -m loadtest.sweep --slo-p99-ms 2000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.client import add_common_arguments, run_async, sampler_from_args, target_url
from loadtest.open_loop import DEFAULT_MAX_IN_FLIGHT, measure_open_loop
from loadtest.report import format_summary, plot_sweep, write_json

DEFAULT_SLO_P99_MS = 2000.0
DEFAULT_MAX_ERROR_RATE = 0.01
# Sender lag p99 beyond this means the load generator, not the service, set the pace.
SENDER_LAG_WARNING_MS = 100.0


@dataclass
class StepVerdict:
    rate: float
    passed: bool
    reason: str
    summary: Mapping[str, Any] = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "passed": self.passed,
            "reason": self.reason,
            "summary": dict(self.summary),
        }


@dataclass
class SweepOutcome:
    steps: list[StepVerdict]
    max_sustainable_rate: float | None
    stop_reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_sustainable_rate": self.max_sustainable_rate,
            "stop_reason": self.stop_reason,
            "steps": [step.as_dict() for step in self.steps],
        }


def sweep_rates(
    start: float, *, growth: float, increment: float | None, max_rate: float, max_steps: int
) -> list[float]:
    """The rates to try: ``start`` then ×``growth`` (or +``increment`` when given), up to
    ``max_rate`` and ``max_steps``."""
    if start <= 0 or max_steps < 1:
        raise ValueError("start must be positive and max_steps at least 1")
    if increment is None and growth <= 1:
        raise ValueError("growth must be above 1")
    if increment is not None and increment <= 0:
        raise ValueError("increment must be positive")
    rates: list[float] = []
    rate = start
    while len(rates) < max_steps and rate <= max_rate * (1 + 1e-9):
        rates.append(round(rate, 4))
        rate = rate + increment if increment is not None else rate * growth
    return rates


def judge_step(
    rate: float, summary: Mapping[str, Any], *, slo_p99_ms: float, max_error_rate: float
) -> StepVerdict:
    """The stop rule for one step."""
    error_rate = summary["error_rate"]
    p99 = summary["latency_ms"]["p99"]
    if error_rate > max_error_rate:
        return StepVerdict(
            rate, False, f"error rate {error_rate:.1%} > {max_error_rate:.1%}", summary
        )
    if p99 is None:
        return StepVerdict(rate, False, "no successful requests", summary)
    if p99 > slo_p99_ms:
        return StepVerdict(rate, False, f"p99 {p99:.0f} ms > SLO {slo_p99_ms:.0f} ms", summary)
    return StepVerdict(rate, True, f"p99 {p99:.0f} ms, error rate {error_rate:.1%}", summary)


def run_sweep(
    rates: Sequence[float],
    measure: Callable[[float], Mapping[str, Any]],
    *,
    slo_p99_ms: float,
    max_error_rate: float,
    time_left_s: Callable[[], float] | None = None,
    step_cost_s: float = 0.0,
    on_step: Callable[[StepVerdict], None] | None = None,
) -> SweepOutcome:
    """Measure each rate in order until a step fails; ``measure(rate)`` returns a summary
    (``report.summarize``). Stops early, without failing, when ``time_left_s()`` is below
    ``step_cost_s``."""
    steps: list[StepVerdict] = []
    best: float | None = None
    for rate in rates:
        if time_left_s is not None and time_left_s() < step_cost_s:
            return SweepOutcome(steps, best, "time budget spent before the service failed a step")
        verdict = judge_step(
            rate, measure(rate), slo_p99_ms=slo_p99_ms, max_error_rate=max_error_rate
        )
        steps.append(verdict)
        if on_step is not None:
            on_step(verdict)
        if not verdict.passed:
            return SweepOutcome(steps, best, f"failed at {rate:g} req/s: {verdict.reason}")
        best = rate
    return SweepOutcome(
        steps, best, "every rate passed; raise --max-rate or --max-steps to find the limit"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--slo-p99-ms", type=float, default=DEFAULT_SLO_P99_MS, help="p99 latency objective"
    )
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=DEFAULT_MAX_ERROR_RATE,
        help="failure fraction allowed",
    )
    parser.add_argument("--start-rate", type=float, default=1.0, help="first rate, req/s")
    parser.add_argument("--growth", type=float, default=1.5, help="rate multiplier per step")
    parser.add_argument(
        "--increment", type=float, default=None, help="add this instead of multiplying"
    )
    parser.add_argument("--max-rate", type=float, default=50.0)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument(
        "--step-duration", type=float, default=20.0, help="seconds of arrivals per step"
    )
    parser.add_argument("--cooldown", type=float, default=2.0, help="idle seconds between steps")
    parser.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT)
    parser.add_argument(
        "--time-budget",
        type=float,
        default=540.0,
        help="no step starts that could end after this many seconds",
    )
    add_common_arguments(parser, default_name="sweep")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rates = sweep_rates(
        args.start_rate,
        growth=args.growth,
        increment=args.increment,
        max_rate=args.max_rate,
        max_steps=args.max_steps,
    )
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with target_url(args) as url:
        print(f"sweep against {url}: rates {rates}, SLO p99 {args.slo_p99_ms:g} ms", flush=True)
        budget_end = time.monotonic() + args.time_budget

        def measure(rate: float) -> Mapping[str, Any]:
            print(f"\n--- {rate:g} req/s for {args.step_duration:g} s", flush=True)
            _, summary = run_async(
                measure_open_loop(
                    url,
                    rate,
                    sampler_from_args(args),  # same input sequence at every step
                    duration_s=args.step_duration,
                    count=None,
                    seed=args.seed,
                    max_in_flight=args.max_in_flight,
                    timeout_s=args.timeout,
                )
            )
            print(format_summary(summary), flush=True)
            if (summary["sender_lag_ms"]["p99"] or 0.0) > SENDER_LAG_WARNING_MS:
                print(
                    "warning: the load generator lagged its schedule; this step measured the generator too"
                )
            time.sleep(args.cooldown)  # let the service drain before the next step
            return summary

        outcome = run_sweep(
            rates,
            measure,
            slo_p99_ms=args.slo_p99_ms,
            max_error_rate=args.max_error_rate,
            time_left_s=lambda: budget_end - time.monotonic(),
            step_cost_s=args.step_duration + args.timeout + args.cooldown,
            on_step=lambda v: print(f"=> {'PASS' if v.passed else 'FAIL'}: {v.reason}", flush=True),
        )
    best = outcome.max_sustainable_rate
    print(
        f"\nhighest sustainable rate: {'none' if best is None else f'{best:g} req/s'} ({outcome.stop_reason})"
    )
    document = {
        "kind": "sweep",
        "url": url,
        "started_at": started_at,
        "config": {
            "slo_p99_ms": args.slo_p99_ms,
            "max_error_rate": args.max_error_rate,
            "rates": rates,
            "step_duration_s": args.step_duration,
            "max_in_flight": args.max_in_flight,
            "timeout_s": args.timeout,
            "spawned_server": args.spawn_server,
            "inputs": sampler_from_args(args).describe(),
        },
        **outcome.as_dict(),
    }
    json_path = write_json(args.results_dir / f"{args.name}.json", document)
    print(f"wrote {json_path}")
    if not args.no_plot and outcome.steps:
        plot = plot_sweep(
            args.results_dir / f"{args.name}.png",
            [step.as_dict() for step in outcome.steps],
            args.slo_p99_ms,
            f"open-loop sweep; highest sustainable rate {best if best is not None else 'none'} req/s",
        )
        if plot:
            print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
