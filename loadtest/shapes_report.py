"""Summarise ``loadtest/machine_shapes.sh``: per machine shape, load and run, continuous
against static p50/p99, throughput and requests not served (429/503, errors and arrivals the
generator dropped at its in-flight cap), and whether continuous is at or below static in
every cell (the acceptance criterion). Then per shape and load, over its runs: the
continuous / static ratios (``paired_report``'s mean, range and runs at or below 1), and each
policy's p50/p99 over every request of every run pooled (one run's p99 rests on its slowest
few dozen requests; many runs' pooled p99 on hundreds). Where the cells ran a control arm
(``compare --control``, ``CONTROL=1 machine_shapes.sh``: a second static batcher in the same
run), a third table puts the A/A beside the A/B: the same statistics for control / static, so
a continuous / static ratio is read against what two identical policies give on this machine.
Prints Markdown tables, writes ``summary.json``.

    .venv/bin/python -m loadtest.shapes_report loadtest/results/shapes
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from loadtest.paired_report import summarise
from loadtest.report import percentile
from loadtest.tail_report import served

CELL = re.compile(r"(?P<shape>.+)-load(?P<load>\d+)-run(?P<run>\d+)\.json$")


def at_or_below(arm: dict[str, Any], static: dict[str, Any]) -> bool:
    """The acceptance of one cell: p50 and p99 at or below static's, throughput within 1 %
    of it or above, no more requests left unserved (shed by the service or dropped by the
    generator: either is a user without a translation, and p50/p99 count served ones only)."""
    return (
        arm["p50_ms"] <= static["p50_ms"]
        and arm["p99_ms"] <= static["p99_ms"]
        and arm["throughput_rps"] >= static["throughput_rps"] * 0.99
        and arm["not_served"] <= static["not_served"]
    )


def cell(path: Path, latencies: dict[tuple[str, int, str], list[float]]) -> dict[str, Any] | None:
    """One cell's row; its successful requests' latencies (s) are added to ``latencies`` by
    (shape, load, arm)."""
    match = CELL.match(path.name)
    if match is None:
        return None
    result = json.loads(path.read_text())
    runs = result["runs"]
    row: dict[str, Any] = {
        "shape": match["shape"],
        "load_pct": int(match["load"]),
        "run": int(match["run"]),
        "rate_rps": result.get("config", {}).get("rate"),
    }
    # a control arm of the static policy is the A/A (a continuous one is another A/B)
    static_control = result.get("config", {}).get("control") in (True, "static")
    arms = ("continuous", "static", "control") if static_control else ("continuous", "static")
    for policy in [arm for arm in arms if arm in runs]:
        summary = runs[policy]["summary"]
        latencies.setdefault((row["shape"], row["load_pct"], policy), []).extend(
            record["latency_s"] for record in served(runs[policy].get("records", []))
        )
        row[policy] = {
            "p50_ms": summary["latency_ms"]["p50"],
            "p99_ms": summary["latency_ms"]["p99"],
            "throughput_rps": summary["throughput_rps"],
            "dropped": summary["by_status"].get("dropped", 0),
            "not_served": summary["failed"],  # every request without a 200 (``summarize``)
        }
    row["continuous_wins"] = at_or_below(row["continuous"], row["static"])
    if "control" in row:
        row["control_wins"] = at_or_below(row["control"], row["static"])
    return row


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["loadtest/results/shapes"])[0])
    latencies: dict[tuple[str, int, str], list[float]] = {}
    rows = sorted(
        (row for path in folder.glob("*.json") if (row := cell(path, latencies)) is not None),
        key=lambda row: (row["shape"], row["load_pct"], row["run"]),
    )
    capacities = {}
    for path in folder.glob("*-capacity.json"):
        capacities[path.name[: -len("-capacity.json")]] = json.loads(path.read_text())["summary"][
            "throughput_rps"
        ]
    for row in rows:  # given as CAPACITY (no closed loop ran): what the cells' rates say
        if row["shape"] not in capacities and row["rate_rps"]:
            capacities[row["shape"]] = round(row["rate_rps"] * 100 / row["load_pct"], 1)
    print(
        "| shape | load | run | continuous p50 / p99 ms | static p50 / p99 ms | req/s c / s | not served c / s (dropped) | continuous at or below |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        c, s = row["continuous"], row["static"]
        print(
            f"| {row['shape']} ({capacities.get(row['shape'], '?')} req/s) | {row['load_pct']} % "
            f"| {row['run']} | {c['p50_ms']:.0f} / {c['p99_ms']:.0f} | {s['p50_ms']:.0f} / "
            f"{s['p99_ms']:.0f} | {c['throughput_rps']:.1f} / {s['throughput_rps']:.1f} | "
            f"{c['not_served']} / {s['not_served']} ({c['dropped']} / {s['dropped']}) | "
            f"{'yes' if row['continuous_wins'] else 'NO'} |"
        )
    loads = over_runs(rows, latencies)
    print()
    print(
        "| shape | load | runs | at or below | p50 c/s mean, range | p99 c/s mean, range | pooled p50 c / s ms | pooled p99 c / s ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for load in loads:
        p50, p99, pooled = load["p50"], load["p99"], load["pooled_ms"]
        print(
            f"| {load['shape']} | {load['load_pct']} % | {load['runs']} | {load['at_or_below']} "
            f"| {p50['mean']:.2f}, {p50['min']:.2f}–{p50['max']:.2f} | {p99['mean']:.2f}, "
            f"{p99['min']:.2f}–{p99['max']:.2f} | {_pair(pooled, 'p50')} | {_pair(pooled, 'p99')} |"
        )
    with_control = [row for row in rows if "control" in row]
    controls = over_runs(with_control, latencies, arm="control")
    if controls:
        print()
        print(
            "| shape | load | runs | at or below: continuous, control | p50 / static mean, range: continuous; control | p99 / static mean, range: continuous; control |"
        )
        print("|---|---|---|---|---|---|")
        # continuous over the same runs as the control (cells without one left out)
        beside = {
            (load["shape"], load["load_pct"]): load for load in over_runs(with_control, latencies)
        }
        for control in controls:
            versus = beside[(control["shape"], control["load_pct"])]
            print(
                f"| {control['shape']} | {control['load_pct']} % | {control['runs']} "
                f"| {versus['at_or_below']}, {control['at_or_below']} "
                f"| {_spread(versus['p50'])}; {_spread(control['p50'])} "
                f"| {_spread(versus['p99'])}; {_spread(control['p99'])} |"
            )
    summary = {"capacity_rps": capacities, "cells": rows, "loads": loads, "controls": controls}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0 if rows and all(row["continuous_wins"] for row in rows) else 1


def over_runs(
    rows: list[dict[str, Any]],
    latencies: dict[tuple[str, int, str], list[float]],
    arm: str = "continuous",
) -> list[dict[str, Any]]:
    """Per (shape, load): the ``arm`` / static ratios over its runs, the runs at or below
    static, and both arms' p50/p99 over the requests of all runs pooled (None: no records)."""
    pairs = [
        {
            "arm": row["shape"],
            "load_pct": row["load_pct"],
            "seed": row["run"],
            "p50": row[arm]["p50_ms"] / row["static"]["p50_ms"],
            "p99": row[arm]["p99_ms"] / row["static"]["p99_ms"],
            "throughput": row[arm]["throughput_rps"] / row["static"]["throughput_rps"],
        }
        for row in rows
    ]
    loads = []
    for ratios in summarise(pairs):
        shape, load = ratios.pop("arm"), ratios["load_pct"]
        pooled: dict[str, dict[str, float | None]] = {}
        for policy in (arm, "static"):
            values = latencies.get((shape, load, policy), [])
            pooled[policy] = {
                f"p{q}": round(percentile(values, q) * 1000, 1) if values else None
                for q in (50, 99)
            }
        loads.append(
            {
                "shape": shape,
                "load_pct": load,
                "runs": ratios.pop("seeds"),
                "at_or_below": sum(
                    row[f"{arm}_wins"]
                    for row in rows
                    if row["shape"] == shape and row["load_pct"] == load
                ),
                **{key: ratios[key] for key in ("p50", "p99", "throughput")},
                "pooled_ms": pooled,
            }
        )
    return loads


def _spread(ratios: dict[str, Any]) -> str:
    return f"{ratios['mean']:.2f}, {ratios['min']:.2f}–{ratios['max']:.2f}"


def _pair(pooled: dict[str, dict[str, float | None]], quantile: str) -> str:
    cont, static = pooled["continuous"][quantile], pooled["static"][quantile]
    if cont is None or static is None:
        return "–"
    return f"{cont:.0f} / {static:.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
