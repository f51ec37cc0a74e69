"""The reports over comparison results: paired ratios, the shapes report's cells, loads and
A/A beside A/B, and the tail report's slow episodes."""

from __future__ import annotations

import json

import pytest


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
