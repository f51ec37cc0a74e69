"""Which models the settings name (service/translation/discovery.py): the exports, the
installed models, the default export when neither names one, and the served name of a model
served alone."""

from __future__ import annotations

import json
from pathlib import Path

from service.translation.discovery import discover_models
from service.translation.model_settings import DEFAULT_EXPORT


def export(directory: Path, **config) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_the_served_model_name_names_a_single_export_and_nothing_when_there_are_more(tmp_path):
    en_de = export(tmp_path / "en-de", source_lang="en", target_lang="de", model_name="opus")
    de_en = export(tmp_path / "de-en", source_lang="de", target_lang="en")
    [alone] = discover_models([en_de], None, served_model_name="house-model")
    assert alone.model_id == "house-model"
    both = discover_models([en_de, de_en], None, served_model_name="house-model")
    assert [spec.model_id for spec in both] == ["opus", "de-en"]


def test_the_default_export_is_served_when_nothing_names_a_model(tmp_path):
    installed = tmp_path / "installed"
    installed.mkdir()
    [spec] = discover_models([], installed)
    assert spec.model_dir == DEFAULT_EXPORT
    export(installed / "en-fr", source_lang="en", target_lang="fr")
    assert [spec.model_id for spec in discover_models([], installed)] == ["en-fr"]
