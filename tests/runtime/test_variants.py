"""The variant a CPU engine opens follows the export's recorded int8 check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.runtime.engine import open_engine
from service.runtime.variants import served_variant
from service.translation.model_settings import ModelSettings

# The session-scoped `exported` fixture, as a plugin: imported into the module, it would be a
# fixture of this module alone and the tiny model exported again.
pytest_plugins = ["tests.onnx_fixtures"]


def export_with_check(
    root: Path, delta: float, holds: bool, variant: bool = True, batch_differences: int | None = 0
) -> Path:
    """A stand-in export directory whose config records an int8 check (``batch_differences``
    None: a check from before the batch check)."""
    fp32 = root / "fp32"
    fp32.mkdir(parents=True)
    check = {"pairs": 600, "chrf_fp32": 60.0, "chrf_int8": 60.0 + delta, "delta_chrf": delta}
    check.update(holds=holds, dir="int8")
    if batch_differences is not None:
        check["batch_differences"] = batch_differences
    (fp32 / "config.json").write_text(json.dumps({"variant": "fp32", "int8_check": check}))
    if variant:
        (fp32 / "int8").mkdir()
        (fp32 / "int8" / "config.json").write_text(json.dumps({"variant": "int8-reduce_range"}))
    return fp32


def test_cpu_serves_int8_when_its_check_holds(tmp_path):
    fp32 = export_with_check(tmp_path, delta=-0.2, holds=True)
    assert served_variant(fp32, on_cpu=True, cpu_int8=True) == fp32 / "int8"


@pytest.mark.parametrize(("delta", "holds"), [(-0.5, False), (-0.5, True), (0.1, False)])
def test_cpu_serves_fp32_when_the_check_fails(tmp_path, delta, holds):
    # A check beyond 0.3 chrF never serves int8, whatever its verdict says.
    fp32 = export_with_check(tmp_path, delta=delta, holds=holds)
    assert served_variant(fp32, on_cpu=True, cpu_int8=True) == fp32


@pytest.mark.parametrize("batch_differences", [None, 3])
def test_cpu_serves_fp32_when_int8_depends_on_its_batch_or_was_never_checked_for_it(
    tmp_path, batch_differences
):
    # An export from before the batch check carries per-matrix int8 whose outputs change with
    # their batch; its chrF check alone holds.
    fp32 = export_with_check(tmp_path, 0.0, holds=True, batch_differences=batch_differences)
    assert served_variant(fp32, on_cpu=True, cpu_int8=True) == fp32


def test_the_setting_and_gpus_keep_fp32(tmp_path):
    fp32 = export_with_check(tmp_path, delta=0.0, holds=True)
    assert served_variant(fp32, on_cpu=True, cpu_int8=False) == fp32
    assert served_variant(fp32, on_cpu=False, cpu_int8=True) == fp32


def test_no_check_or_no_variant_keeps_fp32(tmp_path):
    missing = export_with_check(tmp_path / "a", delta=0.0, holds=True, variant=False)
    assert served_variant(missing, on_cpu=True, cpu_int8=True) == missing
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"variant": "fp32"}))
    assert served_variant(plain, on_cpu=True, cpu_int8=True) == plain


def test_open_engine_opens_the_variant_the_settings_and_check_choose(exported, tmp_path):
    from export.variants import make_int8

    fp32 = tmp_path / "fp32"
    shutil.copytree(exported.onnx_dir, fp32)
    make_int8(fp32, fp32 / "int8")
    config = json.loads((fp32 / "config.json").read_text())
    check = {"pairs": 8, "delta_chrf": -0.1, "batch_differences": 0, "holds": True, "dir": "int8"}
    config["int8_check"] = check
    (fp32 / "config.json").write_text(json.dumps(config))

    # By default: int8 with per-row activation scales does not depend on its batch.
    default = ModelSettings(provider="cpu", intra_op_threads=1)
    int8_engine = open_engine(fp32, default)
    assert int8_engine.model.info.variant == "int8-per_row"
    assert int8_engine.model_dir == fp32 / "int8"
    fp32_asked = ModelSettings(provider="cpu", intra_op_threads=1, cpu_int8=False)
    assert open_engine(fp32, fp32_asked).model.info.variant == "fp32"

    for failed in ({"delta_chrf": -0.4, "holds": False}, {"batch_differences": 2, "holds": False}):
        config["int8_check"] = {**check, **failed}
        (fp32 / "config.json").write_text(json.dumps(config))
        assert open_engine(fp32, default).model.info.variant == "fp32"


def test_auto_provider_counts_as_cpu_unless_cuda_really_runs(monkeypatch, tmp_path):
    from service.runtime import onnx_model

    assert onnx_model.runs_on_cpu(tmp_path, "cpu") and not onnx_model.runs_on_cpu(tmp_path, "cuda")
    monkeypatch.setattr(onnx_model.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert onnx_model.runs_on_cpu(tmp_path, "auto")
    listed = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnx_model.ort, "get_available_providers", lambda: listed)
    monkeypatch.setattr(onnx_model, "cuda_is_usable", lambda path: False)  # listed, cannot load
    assert onnx_model.runs_on_cpu(tmp_path, "auto")
    monkeypatch.setattr(onnx_model, "cuda_is_usable", lambda path: True)
    assert not onnx_model.runs_on_cpu(tmp_path, "auto")
