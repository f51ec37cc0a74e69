"""``MT_MODELS``: the models ``python -m service`` pulls at start-up when they are missing, from
a pre-seeded Hugging Face cache, offline (``HF_HUB_OFFLINE=1``).

The build is replaced by a stand-in that writes an export's config (the real build is
tests/models_cli/test_models_cli.py's): what is pinned here is which names are pulled, into
which directory, what is served afterwards, and that a failed pull stops the start-up."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

import service.__main__
import service.models_cli.pull
from service.config import Settings
from service.models_cli import main as models_main
from service.models_cli.errors import ModelsError
from service.models_cli.startup import pull_missing, startup_settings
from service.translation.discovery import RegistryError, discover_models
from tests.hub_cache import seed, use_offline

HUB_ID = "Helsinki-NLP/opus-mt-en-fr"
COMMIT = hashlib.sha1(b"en-fr").hexdigest()


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    """A Marian checkpoint's files (placeholders: the stand-in build reads none of them)."""
    files = tmp_path / "checkpoint"
    files.mkdir()
    (files / "config.json").write_text(json.dumps({"model_type": "marian"}))
    for name in ("source.spm", "target.spm", "vocab.json", "model.safetensors"):
        (files / name).write_bytes(b"placeholder")
    (files / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    cache = tmp_path / "hub"
    seed(cache, HUB_ID, files, COMMIT)
    use_offline(monkeypatch, cache)
    return cache


@pytest.fixture()
def builds(monkeypatch):
    """The names built; each build writes the config of an export of the name's pair."""
    built: list[str] = []

    def build_export(snapshot, staging, name, variant, pair):
        built.append(name)
        export = staging / "fp32"
        export.mkdir()
        config = {"model_name": name, "source_lang": pair[0], "target_lang": pair[1]}
        (export / "config.json").write_text(json.dumps(config))
        return export

    monkeypatch.setattr(service.models_cli.pull, "require_export_extras", lambda: None)
    monkeypatch.setattr(service.models_cli.pull, "build_export", build_export)
    return built


class NoDownloads:
    """A Hub that fails the test when asked for anything."""

    def snapshot(self, hub_id, revision, patterns):
        raise AssertionError(f"downloaded {hub_id}")

    def files(self, hub_id, revision):
        raise AssertionError(f"listed {hub_id}")


def test_models_setting_is_a_comma_separated_list_and_empty_by_default():
    assert Settings().model.models == []
    assert Settings(models=" opus-mt-en-fr, m2m100_418M ,").model.models == [
        "opus-mt-en-fr",
        "m2m100_418M",
    ]


def test_start_up_pulls_a_missing_model_into_the_data_dir_and_serves_it(
    hub_cache, builds, tmp_path
):
    settings = Settings(data_dir=tmp_path / "data", models="opus-mt-en-fr")
    served = startup_settings(settings)
    assert builds == ["opus-mt-en-fr"]
    assert served.model.models_dir == tmp_path / "data" / "models"
    manifest = json.loads((tmp_path / "data/models/opus-mt-en-fr/manifest.json").read_text())
    assert (manifest["hub_id"], manifest["revision"]) == (HUB_ID, COMMIT)
    model = served.model
    specs = discover_models(model.exports, model.models_dir)
    assert [(spec.model_id, spec.pair) for spec in specs] == [("opus-mt-en-fr", ("en", "fr"))]


def test_start_up_pulls_nothing_that_is_installed(hub_cache, builds, tmp_path):
    settings = Settings(models_dir=tmp_path / "models", models=HUB_ID)  # an id names it too
    startup_settings(settings)
    assert builds == ["opus-mt-en-fr"]
    said: list[str] = []
    assert pull_missing(settings, NoDownloads(), said.append) == []
    assert said == [f"opus-mt-en-fr is installed in {tmp_path / 'models'}"]
    assert builds == ["opus-mt-en-fr"]


def test_without_models_nothing_is_asked_of_the_hub(tmp_path):
    settings = Settings(models_dir=tmp_path / "models")
    assert startup_settings(settings, NoDownloads()).model.models_dir == tmp_path / "models"


def test_a_configured_models_dir_that_is_missing_is_created(tmp_path):
    """A fresh volume: the server serves its other models rather than refusing to start."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    settings = Settings(exports=[shipped], models_dir=tmp_path / "volume" / "models")
    with pytest.raises(RegistryError, match="is not a directory"):
        discover_models([shipped], settings.model.models_dir)
    served = startup_settings(settings)
    assert served.model.models_dir.is_dir()
    specs = discover_models([shipped], served.model.models_dir)
    assert [spec.pair for spec in specs] == [("en", "de")]


def test_a_failed_pull_at_start_up_is_one_log_line_and_exit_status_1(
    hub_cache, builds, tmp_path, monkeypatch, caplog
):
    """As TGI's launcher: a download that fails stops the start-up; nothing is served."""
    settings = Settings(models_dir=tmp_path / "models", models="opus-mt-en-fr,opus-mt-en-xx")
    monkeypatch.setattr(service.__main__, "get_settings", lambda: settings)

    def serve(*args, **kwargs):
        raise AssertionError("served after a failed pull")

    monkeypatch.setattr(service.__main__, "create_app", serve)
    # the process's logging set-up, global: left out here, as other tests' servers set theirs
    monkeypatch.setattr(service.__main__, "start_logging", lambda *args, **kwargs: None)
    monkeypatch.setattr("service.processes.supervisor.build_supervisor", serve)
    with caplog.at_level(logging.ERROR, logger="service.__main__"):
        assert service.__main__.main(["--port", "0"]) == 1
    [line] = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert line.startswith("MT_MODELS: Helsinki-NLP/opus-mt-en-xx is not in the local Hugging")
    assert line.endswith("; not starting") and "Traceback" not in line
    assert builds == ["opus-mt-en-fr"]  # the first name was pulled, the second failed
    assert sorted(path.name for path in (tmp_path / "models").iterdir()) == ["opus-mt-en-fr"]


def test_an_unknown_name_in_models_is_refused_before_any_pull(hub_cache, builds, tmp_path):
    settings = Settings(models_dir=tmp_path / "models", models="opus-mt-en-fr,opus-en-fr")
    with pytest.raises(ModelsError, match="unknown model name 'opus-en-fr'"):
        startup_settings(settings)
    assert builds == [] and not (tmp_path / "models").exists()


def test_sync_pulls_the_missing_models_for_an_init_container(
    hub_cache, builds, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr("service.models_cli.get_settings", lambda: Settings(models="opus-mt-en-fr"))
    models_dir = tmp_path / "models"
    assert models_main(["--models-dir", str(models_dir), "sync"]) == 0
    assert "pulled opus-mt-en-fr" in capsys.readouterr().out
    assert models_main(["--models-dir", str(models_dir), "sync"]) == 0
    assert "nothing to pull" in capsys.readouterr().out
    assert builds == ["opus-mt-en-fr"]


def test_engine_cores_start_only_for_the_load_only_models(tmp_path):
    """MT_LOAD_ONLY saves the memory of the other models in the multi-process mode too: the
    supervisor starts no engine core for them."""
    import shutil

    from service.processes.supervisor import build_supervisor

    root = tmp_path / "models"
    for source, target in (("en", "de"), ("en", "fr")):
        (root / f"{source}-{target}").mkdir(parents=True)
        config = {"source_lang": source, "target_lang": target}
        (root / f"{source}-{target}" / "config.json").write_text(json.dumps(config))
    settings = Settings(
        models_dir=root,
        load_only="en,de",
        provider="cpu",
        host="127.0.0.1",
        port=0,
        process_mode="multi",
    )
    supervisor = build_supervisor(settings)
    assert supervisor is not None
    try:
        assert [spec.model_id for spec in supervisor.specs] == ["en-de"]
        assert [child.name for child in supervisor.engines] == ["engine core en-de/0"] * len(
            supervisor.engines
        )
    finally:
        supervisor.swaps.close()  # its control sockets: a context left to the collector blocks it
        supervisor.listener.close()
        shutil.rmtree(supervisor.run_dir, ignore_errors=True)
