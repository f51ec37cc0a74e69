"""Summarise ``loadtest/machine_shapes.sh``: per machine shape, load and run, continuous
against static p50/p99, throughput and 429s, and whether continuous is at or below static in
every cell (the acceptance of issue #28). Prints a Markdown table, writes ``summary.json``.

    .venv/bin/python -m loadtest.shapes_report loadtest/results/shapes
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

CELL = re.compile(r"(?P<shape>.+)-load(?P<load>\d+)-run(?P<run>\d+)\.json$")


def cell(path: Path) -> dict[str, Any] | None:
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
    for policy in ("continuous", "static"):
        summary = runs[policy]["summary"]
        row[policy] = {
            "p50_ms": summary["latency_ms"]["p50"],
            "p99_ms": summary["latency_ms"]["p99"],
            "throughput_rps": summary["throughput_rps"],
            "shed_429": summary["by_status"].get("429", 0),
        }
    cont, static = row["continuous"], row["static"]
    row["continuous_wins"] = (
        cont["p50_ms"] <= static["p50_ms"]
        and cont["p99_ms"] <= static["p99_ms"]
        and cont["throughput_rps"] >= static["throughput_rps"] * 0.99
        and cont["shed_429"] <= static["shed_429"]
    )
    return row


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["loadtest/results/shapes"])[0])
    rows = sorted(
        (row for path in folder.glob("*.json") if (row := cell(path)) is not None),
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
        "| shape | load | run | continuous p50 / p99 ms | static p50 / p99 ms | req/s c / s | 429 c / s | continuous at or below |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        c, s = row["continuous"], row["static"]
        print(
            f"| {row['shape']} ({capacities.get(row['shape'], '?')} req/s) | {row['load_pct']} % "
            f"| {row['run']} | {c['p50_ms']:.0f} / {c['p99_ms']:.0f} | {s['p50_ms']:.0f} / "
            f"{s['p99_ms']:.0f} | {c['throughput_rps']:.1f} / {s['throughput_rps']:.1f} | "
            f"{c['shed_429']} / {s['shed_429']} | {'yes' if row['continuous_wins'] else 'NO'} |"
        )
    summary = {"capacity_rps": capacities, "cells": rows}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0 if rows and all(row["continuous_wins"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
