"""Where each arm's slowest requests came from, in ``compare`` results: the same arrivals for
every arm, so a tail that one arm has and the others do not is that arm's (its policy, or a
stall of its server), and a tail every arm has is the schedule's (a burst of arrivals).

Per cell and arm: the slowest 1 % of the served requests, grouped into episodes (requests
scheduled within ``GAP_S`` of each other), each with the arrivals of the second before it
against the cell's mean, and every arm's slowest latency for the requests scheduled in the
same window. An episode is the arm's own where every other arm's slowest there is under half
of its own. Then per arm over all cells: how many of its slowest requests fell in its own
episodes.

    .venv/bin/python -m loadtest.tail_report loadtest/results/shapes
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GAP_S = 0.5  # slow requests scheduled closer than this belong to one episode
TAIL_SHARE = 0.01


@dataclass
class Episode:
    start_s: float
    end_s: float
    requests: int  # of the arm's slowest
    arrivals_before: int  # arrivals in the second before it
    slowest_ms: dict[str, float]  # every arm's slowest latency in the window (served only)
    own: bool = False


def served(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("status") == 200 and r.get("latency_s") is not None]


def episodes(
    runs: dict[str, list[dict[str, Any]]], ok: dict[str, list[dict[str, Any]]], arm: str
) -> list[Episode]:
    """``arm``'s slowest ``TAIL_SHARE`` of served requests as episodes (module docstring);
    ``ok``: each arm's served requests (``served``)."""
    count = max(1, int(len(ok[arm]) * TAIL_SHARE))
    slowest_first = sorted(ok[arm], key=lambda r: -r["latency_s"])
    times = sorted(r["scheduled_s"] for r in slowest_first[:count])
    groups: list[list[float]] = []
    for at in times:
        if groups and at - groups[-1][-1] < GAP_S:
            groups[-1].append(at)
        else:
            groups.append([at])
    schedule = [r["scheduled_s"] for r in runs[arm]]
    found = []
    for group in groups:
        start, end = group[0], group[-1]
        slowest = {
            other: 1000
            * max(
                (
                    r["latency_s"]
                    for r in records
                    if start - GAP_S / 2 <= r["scheduled_s"] <= end + GAP_S / 2
                ),
                default=0.0,
            )
            for other, records in ok.items()
        }
        own = all(ms < slowest[arm] / 2 for other, ms in slowest.items() if other != arm)
        before = sum(1 for at in schedule if start - 1.0 <= at < start)
        found.append(Episode(start, end, len(group), before, slowest, own))
    return found


def cell_report(path: Path) -> dict[str, Any] | None:
    result = json.loads(path.read_text())
    if "runs" not in result:
        return None
    runs = {arm: run["records"] for arm, run in result["runs"].items() if run.get("records")}
    if len(runs) < 2:
        return None
    duration = result.get("config", {}).get("duration_s") or max(
        r["scheduled_s"] for records in runs.values() for r in records
    )
    ok = {arm: served(records) for arm, records in runs.items()}  # once a cell, not an episode
    return {
        "cell": path.stem,
        "mean_arrivals_per_s": len(next(iter(runs.values()))) / duration,
        "arms": {arm: episodes(runs, ok, arm) for arm in runs},
    }


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["loadtest/results/shapes"])[0])
    cells = [
        report
        for path in sorted(folder.glob("*.json"))
        if path.name != "summary.json" and (report := cell_report(path)) is not None
    ]
    totals: dict[str, list[int]] = {}  # arm -> [slowest requests, of them in its own episodes]
    for report in cells:
        print(f"{report['cell']} (arrivals {report['mean_arrivals_per_s']:.0f}/s)")
        for arm, found in report["arms"].items():
            total = totals.setdefault(arm, [0, 0])
            total[0] += sum(e.requests for e in found)
            total[1] += sum(e.requests for e in found if e.own)
            parts = [
                f"{e.start_s:.1f}-{e.end_s:.1f} s, {e.requests} slow, {e.arrivals_before} arrivals "
                f"in the second before, slowest "
                + " / ".join(f"{other} {ms:.0f}" for other, ms in e.slowest_ms.items())
                + (" ms: its own" if e.own else " ms")
                for e in found
            ]
            print(f"  {arm}: " + "; ".join(parts))
    print()
    for arm, (slow, own) in totals.items():
        print(f"{arm}: {own} of its {slow} slowest requests in episodes of its own")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
