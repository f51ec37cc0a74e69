"""Summarise ``loadtest/paired_cores.sh``: per arm and load, continuous / static p50 and p99
ratios over the paired seeds (mean, median, range, cells at or below 1) and the throughput
ratio. Each ratio compares two runs on one seed at one time, so the machine's drift cancels
within a pair and the spread over seeds is the noise. Prints a Markdown table, writes
``paired.json``.

    .venv/bin/python -m loadtest.paired_report loadtest/results/paired
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

CELL = re.compile(r"(?P<arm>[A-Za-z0-9_]+)-load(?P<load>\d+)-seed(?P<seed>\d+)\.json$")


def ratios(path: Path) -> dict[str, Any] | None:
    """One pair's continuous / static ratios, or None for a file that is not a cell."""
    match = CELL.match(path.name)
    if match is None:
        return None
    runs = json.loads(path.read_text())["runs"]
    cont, static = runs["continuous"]["summary"], runs["static"]["summary"]
    return {
        "arm": match["arm"],
        "load_pct": int(match["load"]),
        "seed": int(match["seed"]),
        "p50": cont["latency_ms"]["p50"] / static["latency_ms"]["p50"],
        "p99": cont["latency_ms"]["p99"] / static["latency_ms"]["p99"],
        "throughput": cont["throughput_rps"] / static["throughput_rps"],
    }


def summarise(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (arm, load): each ratio's mean, median, range and cells at or below 1."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["arm"], cell["load_pct"]), []).append(cell)
    rows = []
    for (arm, load), group in sorted(groups.items()):
        row: dict[str, Any] = {"arm": arm, "load_pct": load, "seeds": len(group)}
        for measure in ("p50", "p99", "throughput"):
            values = [cell[measure] for cell in group]
            row[measure] = {
                "mean": round(statistics.mean(values), 3),
                "median": round(statistics.median(values), 3),
                "min": round(min(values), 3),
                "max": round(max(values), 3),
                "at_or_below_1": sum(value <= 1 for value in values),
            }
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["loadtest/results/paired"])[0])
    cells = [cell for path in sorted(folder.glob("*.json")) if (cell := ratios(path))]
    rows = summarise(cells)
    print(
        "| arm | load | seeds | p50 c/s mean (≤ 1) | p99 c/s mean, median, range (≤ 1) | req/s c/s |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        p50, p99, rps = row["p50"], row["p99"], row["throughput"]
        print(
            f"| {row['arm']} | {row['load_pct']} % | {row['seeds']} | {p50['mean']:.2f} "
            f"({p50['at_or_below_1']}) | {p99['mean']:.2f}, {p99['median']:.2f}, "
            f"{p99['min']:.2f}–{p99['max']:.2f} ({p99['at_or_below_1']}) | {rps['mean']:.3f} |"
        )
    (folder / "paired.json").write_text(json.dumps({"cells": cells, "arms": rows}, indent=2))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
