"""The Markdown summary of ``python -m loadtest scaling``: per shape, the machine and plan,
capacity and p50/p99 and requests not served at each load; CPU-seconds per request by process
kind at the accounted load; and the capacity that projects on more cores.

    .venv/bin/python -m loadtest.scaling_report loadtest/results/scaling
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _rps(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _plan(result: dict[str, Any]) -> str:
    plan = result.get("plan") or {}
    if not plan:
        return result.get("plan_logged") or "?"
    return (
        f"{plan.get('frontends', 0):g} FE, {plan.get('engine_replicas', 0):g} EC x "
        f"{plan.get('intra_op_threads', 0):g} thr"
    )


def render(results: Iterable[dict[str, Any]]) -> str:
    results = list(results)
    lines = [
        "| shape | machine | plan | capacity req/s | load | rate | p50 / p99 ms | not served |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|")
    for result in results:
        shape, facts = result["shape"], result["machine"]
        flags = "/".join(f for f in ("avx2", "avx512f", "avx512_vnni") if facts.get(f)) or "-"
        where = f"{shape['name']} (server {shape['server_cpus']}, client {shape['client_cpus']})"
        about = f"{facts.get('cpu', '?')}, {facts.get('cores')} cores, {flags}"
        if facts.get("cgroup_quota_cpus"):
            about += f", quota {facts['cgroup_quota_cpus']:g}"
        for index, point in enumerate(result["loads"]):
            head = (
                [where, about, _plan(result), f"{result['capacity_rps']:.1f}"]
                if index == 0
                else ["", "", "", ""]
            )
            lines.append(
                "| "
                + " | ".join(
                    [
                        *head,
                        f"{point['load_pct']} %",
                        f"{point['rate_rps']:g}",
                        f"{_ms(point['p50_ms'])} / {_ms(point['p99_ms'])}",
                        str(point["not_served"]),
                    ]
                )
                + " |"
            )
    lines += [
        "",
        "| shape | load | kind | processes | CPU ms / request | busiest process ms / req | busiest thread ms / req | cores busy |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|")
    projections = []
    for result in results:
        for point in result["loads"]:
            cpu = point.get("cpu")
            if not cpu:
                continue
            for kind, entry in sorted(cpu["by_kind"].items()):
                busy = entry.get("cores_busy")
                lines.append(
                    f"| {result['shape']['name']} | {point['load_pct']} % | {kind} "
                    f"| {entry['processes']} | {entry['cpu_s_per_request'] * 1000:.2f} "
                    f"| {entry['busiest_process_cpu_s_per_request'] * 1000:.2f} "
                    f"| {entry['busiest_thread_cpu_s_per_request'] * 1000:.2f} "
                    f"| {'–' if busy is None else f'{busy:.2f}'} |"
                )
            lines.append(
                f"| {result['shape']['name']} | {point['load_pct']} % | **all** | "
                f"| **{cpu['total_cpu_s_per_request'] * 1000:.2f}** "
                f"| {cpu['serial_cpu_s_per_request'] * 1000:.2f} "
                f"| {cpu['busiest_thread_cpu_s_per_request'] * 1000:.2f} | |"
            )
            projections.append((result["shape"]["name"], cpu["projection"]))
    if projections:
        cores = list(projections[0][1])
        # both bounds shown: the cap is one process of the measured shape's plan, and a plan
        # for more cores has more of them
        lines += ["", "| shape | " + " | ".join(f"{c} cores req/s" for c in cores) + " |"]
        lines.append("|---|" + "---|" * len(cores))
        for name, projection in projections:
            cells = [
                f"{_rps(p['spread_rps'])} (serial cap {_rps(p['serial_cap_rps'])})"
                for p in projection.values()
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_summary(folder: Path, paths: Iterable[Path] | None = None) -> Path:
    """``folder/summary.md`` from the given results (else every scaling JSON in ``folder``)."""
    chosen = sorted(folder.glob("*.json")) if paths is None else list(paths)
    results = [json.loads(path.read_text()) for path in chosen]
    summary = folder / "summary.md"
    summary.write_text(render(r for r in results if r.get("kind") == "scaling"))
    return summary


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["loadtest/results/scaling"])[0])
    path = write_summary(folder)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
