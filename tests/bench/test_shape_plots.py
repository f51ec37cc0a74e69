"""The machine-shape plots: the series drawn are the summaries' figures, and both PNGs are
written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "shape_plots.py"
spec = importlib.util.spec_from_file_location("shape_plots", SCRIPT)
assert spec is not None and spec.loader is not None
shape_plots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape_plots)


def _cell(shape: str, load: int, run: int, continuous_p99: float, static_p99: float) -> dict:
    arm = {"p50_ms": 1.0, "throughput_rps": 1.0, "dropped": 0, "not_served": 0}
    return {
        "shape": shape, "load_pct": load, "run": run,
        "continuous": {**arm, "p99_ms": continuous_p99}, "static": {**arm, "p99_ms": static_p99},
    }  # fmt: skip


@pytest.fixture
def folders(tmp_path: Path) -> list[Path]:
    cpu, gpu = tmp_path / "serve-cpu", tmp_path / "serve-gpu"
    cpu.mkdir(), gpu.mkdir()
    (cpu / "summary.json").write_text(json.dumps({
        "capacity_rps": {"8core": 700.0, "4core": 380.0, "16shared": 1100.0},
        "cells": [_cell("4core", 85, 1, 40, 90), _cell("4core", 85, 2, 60, 70),
                  _cell("4core", 85, 3, 50, 80), _cell("4core", 50, 1, 20, 30)],
    }))  # fmt: skip
    scaling = tmp_path / "scaling-cpu"  # `loadtest scaling`: one JSON per shape
    scaling.mkdir()
    (scaling / "2core.json").write_text(json.dumps({"capacity_rps": 190.5, "loads": []}))
    (scaling / "notes.json").write_text(json.dumps({"capacity_rps": {"not": "a shape"}}))
    (gpu / "summary.json").write_text(json.dumps({
        "capacity_rps": {"gpu": 1600.0}, "cells": [_cell("gpu", 120, 1, 300, 900)],
    }))  # fmt: skip
    return [cpu, scaling, gpu]


def test_series_are_the_summaries_figures(folders: list[Path]) -> None:
    summary = shape_plots.read_summaries(folders)
    by_cores, others = shape_plots.capacity_series(summary)
    assert by_cores == [(2, 190.5), (4, 380.0), (8, 700.0), (16, 1100.0)]
    assert others == {"gpu": 1600.0}
    series = shape_plots.p99_series(summary)
    assert series["4core"]["continuous"] == [(50, 20), (85, 50)]  # the median of three runs
    assert series["4core"]["static"] == [(50, 30), (85, 80)]
    assert series["gpu"]["static"] == [(120, 900)]


def test_both_plots_are_written(folders: list[Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written = shape_plots.draw(shape_plots.read_summaries(folders), tmp_path / "plots")
    assert [path.name for path in written] == ["capacity_vs_cores.png", "p99_vs_load.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
