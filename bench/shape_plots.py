"""Draw the machine-shape results: capacity against cores, and p99 against load per shape.

    python bench/shape_plots.py loadtest/results/shapes [MORE_FOLDERS...] --out bench/results

Reads, in each folder, the ``summary.json`` that ``python -m loadtest.shapes_report FOLDER``
writes (``loadtest/machine_shapes.sh``'s cells: continuous against static) and the per-shape
JSON of ``python -m loadtest scaling`` (capacity as ``make serve`` runs; ``bench/gpu_session.sh``
leaves both kinds), and writes two PNGs with matplotlib:

* ``capacity_vs_cores.png``: closed-loop capacity of every CPU shape against its cores (the
  number the shape's name starts with: ``4core``, ``16shared``), with the line of linear
  scaling from the smallest shape; shapes without a core count (``gpu``) are drawn as
  horizontal lines, so the GPU reads against the CPU curve;
* ``p99_vs_load.png``: one panel per shape, p99 of continuous and static batching against the
  offered load (% of capacity), the median over the shape's runs at each load.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

POLICIES = ("continuous", "static")
_CORES = re.compile(r"^(\d+)")


def cores_of(shape: str) -> int | None:
    """The core count a shape's name starts with (``8core`` -> 8); None for ``gpu``."""
    match = _CORES.match(shape)
    return int(match.group(1)) if match else None


def read_summaries(folders: Iterable[Path]) -> dict[str, Any]:
    """Every folder's results merged: capacities by shape, and all cells."""
    capacity: dict[str, float] = {}
    cells: list[dict[str, Any]] = []
    for folder in folders:
        if (folder / "summary.json").exists():
            summary = json.loads((folder / "summary.json").read_text())
            capacity.update(summary["capacity_rps"])
            cells += summary["cells"]
        for path in sorted(folder.glob("*.json")):
            document = json.loads(path.read_text()) if path.name != "summary.json" else None
            rps = document.get("capacity_rps") if isinstance(document, dict) else None
            if isinstance(rps, int | float) and not isinstance(rps, bool):
                capacity[path.stem] = float(rps)  # a `loadtest scaling` shape
    return {"capacity_rps": capacity, "cells": cells}


def capacity_series(summary: dict[str, Any]) -> tuple[list[tuple[int, float]], dict[str, float]]:
    """``[(cores, req/s)]`` of the CPU shapes by cores, and ``{shape: req/s}`` of the others."""
    by_cores, others = [], {}
    for shape, rps in summary["capacity_rps"].items():
        cores = cores_of(shape)
        if cores is None:
            others[shape] = rps
        else:
            by_cores.append((cores, rps))
    return sorted(by_cores), others


def p99_series(summary: dict[str, Any]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{shape: {policy: [(load %, median p99 ms over runs)]}}``."""
    grouped: dict[tuple[str, str, int], list[float]] = {}
    for cell in summary["cells"]:
        for policy in POLICIES:
            key = (cell["shape"], policy, cell["load_pct"])
            grouped.setdefault(key, []).append(cell[policy]["p99_ms"])
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for (shape, policy, load), values in sorted(grouped.items()):
        series.setdefault(shape, {}).setdefault(policy, []).append(
            (load, statistics.median(values))
        )
    return series


def draw(summary: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    by_cores, others = capacity_series(summary)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    if by_cores:
        cores, rps = zip(*by_cores, strict=True)
        axis.plot(cores, rps, marker="o", label="CPU")
        axis.plot(
            cores, [rps[0] * c / cores[0] for c in cores], linestyle=":", color="grey",
            label=f"linear from {cores[0]} cores",
        )  # fmt: skip
    for shape, rps in others.items():
        axis.axhline(rps, linestyle="--", label=f"{shape}: {rps:.0f} req/s")
    axis.set_xlabel("server cores")
    axis.set_ylabel("closed-loop capacity (req/s)")
    axis.legend()
    axis.grid(alpha=0.3)
    capacity_png = out / "capacity_vs_cores.png"
    figure.savefig(capacity_png, dpi=120, bbox_inches="tight")
    plt.close(figure)

    series = p99_series(summary)
    figure, axes = plt.subplots(
        1, max(1, len(series)), figsize=(4.5 * max(1, len(series)), 4), squeeze=False
    )
    for axis, (shape, policies) in zip(axes[0], series.items(), strict=False):
        for policy, points in policies.items():
            loads, p99 = zip(*points, strict=True)
            axis.plot(loads, p99, marker="o", label=policy)
        axis.set_title(f"{shape} ({summary['capacity_rps'].get(shape, '?')} req/s)")
        axis.set_xlabel("offered load (% of capacity)")
        axis.set_ylabel("p99 (ms)")
        axis.set_yscale("log")
        axis.legend()
        axis.grid(alpha=0.3)
    figure.tight_layout()
    p99_png = out / "p99_vs_load.png"
    figure.savefig(p99_png, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return [capacity_png, p99_png]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    for path in draw(read_summaries(args.folders), args.out):
        print(path)


if __name__ == "__main__":
    main()
