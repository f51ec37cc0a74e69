"""The export's int8 variant for CPUs and the held-out check it records."""

from __future__ import annotations

import json
import shutil

import pytest

from export import int8_check
from export.int8_check import add_cpu_int8, heldout_pairs
from service.runtime.variants import served_variant

# The session-scoped `exported` fixture, as a plugin: imported into the module, it would be a
# fixture of this module alone and the tiny model exported again.
pytest_plugins = ["tests.onnx_fixtures"]


def test_heldout_pairs_follow_the_direction():
    en_de, de_en = heldout_pairs("en", "de", limit=50), heldout_pairs("de", "en", limit=50)
    assert len(en_de) == len(de_en) == 50
    assert [(b, a) for a, b in en_de] == de_en  # the same pairs, sides swapped
    assert heldout_pairs("en", "fr") == [] and heldout_pairs("en", "en") == []


def with_pair(source, tmp_path, pair):
    fp32 = tmp_path / "fp32"
    shutil.copytree(source, fp32)
    config = json.loads((fp32 / "config.json").read_text())
    config["source_lang"], config["target_lang"] = pair
    (fp32 / "config.json").write_text(json.dumps(config))
    return fp32


@pytest.mark.parametrize("int8_quality", ["same", "worse", "batch-dependent"])
def test_export_records_the_int8_check_and_serving_follows_it(
    exported,
    tmp_path,
    monkeypatch,
    int8_quality,
):
    # Translations stand in for the engine's (the tiny model has no tokenizer): fp32 returns
    # the references, int8 the same, or with the second half of every string gone, or with
    # one string different when it is translated alone.
    references = dict(heldout_pairs("en", "de", limit=8))

    def translate(export_dir, texts, batch=int8_check.BATCH):
        outputs = [references[text] for text in texts]
        if export_dir.name == "int8" and int8_quality == "worse":
            outputs = [text[: len(text) // 2] for text in outputs]
        if export_dir.name == "int8" and int8_quality == "batch-dependent" and batch == 1:
            outputs[3] += "!"
        return outputs

    monkeypatch.setattr(int8_check, "translate", translate)
    fp32 = with_pair(exported.onnx_dir, tmp_path, ("en", "de"))
    check = add_cpu_int8(fp32, limit=8)
    recorded = json.loads((fp32 / "config.json").read_text())["int8_check"]
    assert recorded == {**check, "dir": "int8"}
    assert check["pairs"] == 8 and check["direction"] == "en→de" and check["chrf_fp32"] == 100
    assert check["batch_differences"] == (int8_quality == "batch-dependent")
    assert check["holds"] is (int8_quality == "same")
    int8_config = json.loads((fp32 / "int8" / "config.json").read_text())
    assert int8_config["variant"] == "int8-per_row" and int8_config["quality_check"] == check
    assert "int8_check" not in int8_config
    expected = fp32 / "int8" if int8_quality == "same" else fp32
    assert served_variant(fp32, on_cpu=True, cpu_int8=True) == expected


def test_a_pair_without_references_gets_no_variant(exported, tmp_path):
    fp32 = with_pair(exported.onnx_dir, tmp_path, ("en", "fr"))
    check = add_cpu_int8(fp32)
    assert check["pairs"] == 0 and check["holds"] is False
    assert not (fp32 / "int8").exists()
    assert served_variant(fp32, on_cpu=True, cpu_int8=True) == fp32
