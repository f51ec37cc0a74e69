"""``python -m service models``: pull, list, update and remove against a pre-seeded Hugging
Face cache, offline (``HF_HUB_OFFLINE=1``: nothing is downloaded).

The cache has the Hub's own layout (``models--ORG--NAME/snapshots/<commit>/``, ``refs/main``)
and holds a tiny random Marian checkpoint saved by transformers with a SentencePiece
tokenizer trained here, so a pull resolves, imports, exports and verifies it as it would a
real OPUS-MT model; the installed model then serves through both APIs and the real
LibreTranslate client.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from service.__main__ import main as service_main
from service.config import Settings
from service.models_cli import main as models_main
from service.models_cli.catalog import TOKENIZER_FILES, resolve
from service.models_cli.errors import ModelsError
from service.models_cli.store import MANIFEST_FILE, sha256_of
from service.translation.discovery import RegistryError, discover_models
from tests.conftest import build_random_marian
from tests.hub_cache import pull_offline, seed, use_offline
from tests.live_server import free_port, live_server
from tests.process_tree import children, multiprocess_env, start_service, stop_service
from tests.service_fixtures import VOCAB_SIZE, train_tiny_tokenizer

HUB_ID = "Helsinki-NLP/opus-mt-en-fr"
ALIAS = "opus-mt-en-fr"
FIRST = hashlib.sha1(b"first revision").hexdigest()  # a commit hash, as the Hub names them
SECOND = hashlib.sha1(b"second revision").hexdigest()
MAX_NEW = 12
TEXT = "Save the file"


def tiny_opus_mt(directory: Path, seed_value: int):
    """A random Marian en→fr checkpoint as transformers saves it, with a SentencePiece
    tokenizer and a model card; returns the transformers model."""
    import torch

    model = build_random_marian(
        directory,
        seed=seed_value,
        vocab_size=VOCAB_SIZE,
        pad_token_id=VOCAB_SIZE - 1,
        decoder_start_token_id=VOCAB_SIZE - 1,
        tie_word_embeddings=False,
    )
    with torch.no_grad():
        model.final_logits_bias[0, 0] = 7.5  # eos likely: short outputs
    model.save_pretrained(directory)
    train_tiny_tokenizer(directory, placeholder_symbols=False)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.update(source_lang="en", target_lang="fr")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "README.md").write_text("---\nlicense: apache-2.0\n---\n# opus-mt-en-fr\n")
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny checkpoint's directory and its transformers model."""
    directory = tmp_path_factory.mktemp("checkpoint") / "opus-mt-en-fr"
    return directory, tiny_opus_mt(directory, seed_value=3)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, checkpoint):
    cache = tmp_path_factory.mktemp("hf_home") / "hub"
    seed(cache, HUB_ID, checkpoint[0], FIRST)
    return cache


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch, hub_cache):
    use_offline(monkeypatch, hub_cache)


@pytest.fixture(scope="module")
def pulled(tmp_path_factory, hub_cache):
    """The models directory after ``pull opus-mt-en-fr`` (the one export of most tests)."""
    return pull_offline(hub_cache, tmp_path_factory.mktemp("models"), ALIAS)


def run(models_dir: Path, *argv: str, capsys=None) -> tuple[int, str, str]:
    code = models_main(["--models-dir", str(models_dir), *argv])
    out, err = capsys.readouterr() if capsys else ("", "")
    return code, out, err


def snapshot_of(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` with its bytes: what 'unchanged' is checked against."""
    if not directory.exists():
        return {}
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


# --- names -------------------------------------------------------------------------------------


def test_an_alias_and_a_hub_id_name_the_same_install():
    assert resolve(ALIAS) == resolve(HUB_ID)
    assert resolve(ALIAS).hub_id == HUB_ID and resolve(ALIAS).pair == ("en", "fr")
    assert resolve("nllb-200-distilled-600M").hub_id == "facebook/nllb-200-distilled-600M"
    with pytest.raises(ModelsError, match="unknown model name 'opus-en-fr'"):
        resolve("opus-en-fr")


def test_the_pull_fetches_every_tokenizer_file_the_importers_read():
    from models.save_format import TOKENIZER_FILES as IMPORTED

    assert set(TOKENIZER_FILES) == set(IMPORTED)


# --- pull ----------------------------------------------------------------------------------------


def test_pull_installs_the_export_with_its_manifest(pulled):
    installed = pulled / ALIAS
    config = json.loads((installed / "config.json").read_text())
    assert (config["source_lang"], config["target_lang"], config["model_name"]) == (
        "en",
        "fr",
        ALIAS,
    )
    manifest = json.loads((installed / MANIFEST_FILE).read_text())
    assert manifest["hub_id"] == HUB_ID and manifest["revision"] == FIRST
    assert manifest["licence"] == "apache-2.0" and manifest["variant"] == "fp32"
    assert manifest["languages"] == ["en", "fr"]
    on_disk = {p.name for p in installed.iterdir()} - {MANIFEST_FILE}
    assert set(manifest["files"]) == on_disk >= {"encoder.onnx", "decoder.onnx", "source.spm"}
    for name, digest in manifest["files"].items():
        assert sha256_of(installed / name) == digest
    assert sorted(p.name for p in pulled.iterdir()) == [ALIAS]  # no staging left behind


def test_list_shows_languages_variant_revision_and_source(pulled, capsys):
    code, out, _ = run(pulled, "list", capsys=capsys)
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "LANGUAGES", "VARIANT", "SIZE", "REVISION", "SOURCE"]
    assert row.split()[:3] == [ALIAS, "en→fr", "fp32"]
    assert FIRST[:12] in row and HUB_ID in row


def test_pull_by_hub_id_of_an_installed_revision_changes_nothing(pulled, capsys):
    before = snapshot_of(pulled)
    code, out, _ = run(pulled, "pull", HUB_ID, capsys=capsys)
    assert code == 0 and "installed already" in out
    assert snapshot_of(pulled) == before


def test_update_offline_with_the_same_revision_changes_nothing(pulled, capsys):
    before = snapshot_of(pulled)
    code, out, _ = run(pulled, "update", capsys=capsys)
    assert code == 0 and "up to date" in out
    assert snapshot_of(pulled) == before


# --- serving -------------------------------------------------------------------------------------


def hf_generate(model, tokenizer, text: str) -> str:
    import torch

    config = model.config
    ids = torch.tensor([tokenizer.encode_one(text)])
    output = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        num_beams=1,
        do_sample=False,
        max_new_tokens=MAX_NEW,
        forced_eos_token_id=None,
        bad_words_ids=[[config.pad_token_id], [tokenizer.unk_id]],
    )
    tokens = output[0].tolist()[1:]
    if config.eos_token_id in tokens:
        tokens = tokens[: tokens.index(config.eos_token_id)]
    return tokenizer.decode(tokens)


def test_a_pulled_model_serves_both_apis_as_transformers_generates(pulled, checkpoint):
    from libretranslatepy import LibreTranslateAPI

    from service.text.tokenizer import Tokenizer

    settings = Settings(models_dir=pulled, provider="cpu", intra_op_threads=1)
    expected = hf_generate(checkpoint[1], Tokenizer.from_dir(pulled / ALIAS), TEXT)
    with live_server(settings) as url:
        body = {"text": TEXT, "source_lang": "en", "target_lang": "fr", "max_new_tokens": MAX_NEW}
        response = httpx.post(f"{url}v1/translate", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["models"] == [ALIAS]
        assert response.json()["translations"][0]["text"] == expected
        api = LibreTranslateAPI(url)
        assert {entry["code"]: entry["targets"] for entry in api.languages()} == {
            "en": ["fr"],
            "fr": [],
        }
        direct = httpx.post(f"{url}v1/translate", json={**body, "max_new_tokens": None}).json()
        assert api.translate(TEXT, source="en", target="fr") == direct["translations"][0]["text"]


def test_a_pulled_model_replaces_a_configured_model_of_its_pair(pulled, tmp_path):
    shipped = tmp_path / "shipped-en-fr"
    shipped.mkdir()
    (shipped / "config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "fr"}))
    other = tmp_path / "shipped-en-de"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    specs = discover_models([shipped, other], pulled)
    assert {spec.model_id: spec.pair for spec in specs} == {
        "shipped-en-de": ("en", "de"),
        ALIAS: ("en", "fr"),
    }


def write_export_config(directory: Path, **config) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_two_installed_models_of_one_pair_are_a_start_up_error(tmp_path):
    root = tmp_path / "models"
    write_export_config(root / "a", source_lang="en", target_lang="fr")
    write_export_config(root / "b", source_lang="en", target_lang="fr")
    with pytest.raises(RegistryError, match="two models with the language pair"):
        discover_models([], root)


def test_load_only_serves_the_models_of_the_listed_languages(tmp_path):
    root = tmp_path / "models"
    write_export_config(root / "en-de", source_lang="en", target_lang="de")
    write_export_config(root / "de-en", source_lang="de", target_lang="en")
    write_export_config(root / "en-fr", source_lang="en", target_lang="fr")
    write_export_config(root / "nllb", languages=["eng_Latn", "deu_Latn", "spa_Latn"])
    write_export_config(root / ".hidden-en-it", source_lang="en", target_lang="it")  # a staging dir
    everything = discover_models([], root)
    assert sorted(spec.model_id for spec in everything) == ["de-en", "en-de", "en-fr", "nllb"]
    specs = {spec.model_id: spec for spec in discover_models([], root, "", ["EN", "de"])}
    assert set(specs) == {"en-de", "de-en", "nllb"}
    assert specs["nllb"].languages == ("en", "de")  # cut down to the listed languages
    assert sorted(specs["nllb"].pairs()) == [("de", "en"), ("en", "de")]
    with pytest.raises(RegistryError, match="MT_LOAD_ONLY=it,ja leaves no model"):
        discover_models([], root, "", ["it", "ja"])


def test_load_only_setting_splits_and_reaches_the_served_languages(pulled, tmp_path):
    from fastapi.testclient import TestClient

    from service.wiring import create_app

    copy = tmp_path / "opus-mt-de-en"
    shutil.copytree(pulled / ALIAS, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(source_lang="de", target_lang="en", model_name="opus-mt-de-en")
    (copy / "config.json").write_text(json.dumps(config))
    settings = Settings(
        exports=[copy], models_dir=pulled, load_only="de,en", provider="cpu", lazy_load=True
    )
    assert settings.model.load_only == ["de", "en"]
    with TestClient(create_app(settings)) as client:
        assert [card["id"] for card in client.get("/v1/models").json()["data"]] == ["opus-mt-de-en"]
        languages = {entry["code"]: entry["targets"] for entry in client.get("/languages").json()}
        assert languages == {"de": ["en"], "en": []}


# --- update and remove ---------------------------------------------------------------------------


def second_revision(pulled, hub_cache, checkpoint, tmp_path, monkeypatch, decoder=None):
    """A copy of the models directory, and the Hub's main moved to a new commit whose build
    is a copy of the installed export (``decoder``: that file's new bytes); the names of the
    snapshots built. The pull test covers the real build."""
    from huggingface_hub import constants

    import service.models_cli.pull

    models_dir = tmp_path / "models"
    shutil.copytree(pulled, models_dir)
    cache = tmp_path / "hub"
    shutil.copytree(hub_cache, cache)
    changed = tmp_path / "changed"
    shutil.copytree(checkpoint[0], changed)
    (changed / "README.md").write_text("---\nlicense: mit\n---\n")
    seed(cache, HUB_ID, changed, SECOND)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    built_from = []

    def build_export(snapshot, staging, name, variant, pair):
        built_from.append(Path(snapshot).name)
        shutil.copytree(
            pulled / ALIAS, staging / "fp32", ignore=shutil.ignore_patterns(MANIFEST_FILE)
        )
        if decoder is not None:
            (staging / "fp32" / "decoder.onnx").write_bytes(decoder)
        return staging / "fp32"

    monkeypatch.setattr(service.models_cli.pull, "build_export", build_export)
    return models_dir, built_from


def test_update_replaces_a_model_whose_revision_moved(
    pulled, hub_cache, checkpoint, tmp_path, monkeypatch, capsys
):
    new_decoder = b"the new revision's decoder"
    models_dir, built_from = second_revision(
        pulled, hub_cache, checkpoint, tmp_path, monkeypatch, new_decoder
    )
    code, out, _ = run(models_dir, "update", ALIAS, capsys=capsys)
    assert code == 0, out
    assert built_from == [SECOND]
    manifest = json.loads((models_dir / ALIAS / MANIFEST_FILE).read_text())
    assert (manifest["revision"], manifest["licence"]) == (SECOND, "mit")
    assert (models_dir / ALIAS / "decoder.onnx").read_bytes() == new_decoder
    assert manifest["files"]["decoder.onnx"] == sha256_of(models_dir / ALIAS / "decoder.onnx")
    assert sorted(p.name for p in models_dir.iterdir()) == [ALIAS]  # the old one is gone


def test_update_swaps_the_served_model_without_a_failed_request(
    pulled, hub_cache, checkpoint, tmp_path, monkeypatch
):
    """Clients translate without a pause while ``update`` installs the new revision and the
    one-process service swaps it in: every request succeeds, and the new revision serves."""
    from service.wiring import create_app

    models_dir, _ = second_revision(pulled, hub_cache, checkpoint, tmp_path, monkeypatch)
    settings = Settings(
        models_dir=models_dir, provider="cpu", intra_op_threads=1, reload_poll_s=0.02
    )
    app = create_app(settings)
    body = {"text": TEXT, "source_lang": "en", "target_lang": "fr", "max_new_tokens": MAX_NEW}
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def translate_until_stopped(url: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                response = client.post(f"{url}v1/translate", json=body)
                answers.append((response.status_code, response.text))

    def revision(url: str) -> str:
        return httpx.get(f"{url}v1/models").json()["data"][0]["revision"]

    with live_server(app=app) as url:
        slot = app.state.service.registry.slots[ALIAS]
        old = slot.model
        assert revision(url) == FIRST
        clients = [threading.Thread(target=translate_until_stopped, args=(url,)) for _ in "abc"]
        for client in clients:
            client.start()
        try:
            while len(answers) < 10:
                time.sleep(0.01)
            assert run(models_dir, "update", ALIAS)[0] == 0
            deadline = time.monotonic() + 60
            while not old.batcher.queue.stopping and time.monotonic() < deadline:
                time.sleep(0.01)
            during = len(answers)
            while len(answers) < during + 10:  # served by the new model
                time.sleep(0.01)
        finally:
            stop.set()
            for client in clients:
                client.join(30)
        assert revision(url) == SECOND
    assert slot.model is not old and old.batcher.queue.stopping  # the old one has stopped
    failed = [answer for answer in answers if answer[0] != 200]
    assert not failed, failed[:3]
    texts = {json.loads(text)["translations"][0]["text"] for _, text in answers}
    assert len(texts) == 1  # the same weights, before and after


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_update_swaps_the_engine_cores_of_the_multi_process_service_without_a_failed_request(
    pulled, hub_cache, checkpoint, tmp_path, monkeypatch
):
    """As above, with the supervisor, two front-ends and an engine core as processes: the
    supervisor starts an engine core of the new revision and moves the front-ends to it, and
    the old engine core exits once both front-ends have moved; every request succeeds."""
    models_dir, _ = second_revision(pulled, hub_cache, checkpoint, tmp_path, monkeypatch)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = multiprocess_env(
        MT_MODELS_DIR=str(models_dir),
        MT_RELOAD_POLL_S="0.1",
        MT_DATA_DIR=str(tmp_path / "data"),
        MT_LOG_LEVEL="info",
        HF_HUB_OFFLINE="1",
    )
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        server = start_service(port, env, log)
    body = {"text": TEXT, "source_lang": "en", "target_lang": "fr", "max_new_tokens": MAX_NEW}
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def translate_until_stopped() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not stop.is_set():
                response = client.post("/v1/translate", json=body)
                answers.append((response.status_code, response.text))

    def revisions() -> set[str]:  # as the front-ends that answer say (each is asked a few times)
        with httpx.Client(base_url=base, timeout=10) as client:
            return {client.get("/v1/models").json()["data"][0]["revision"] for _ in range(6)}

    def engine_cores() -> set[int]:
        return {pid for pid, cmd in children(server.pid).items() if "engine_process" in cmd}

    def wait_until(condition, what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert server.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, f"never: {what}\n{log_path.read_text()[-4000:]}"
            time.sleep(0.05)

    clients = [threading.Thread(target=translate_until_stopped) for _ in "abc"]
    try:
        wait_until(lambda: all(ready(base) for _ in range(10)), "both front-ends are ready", 120)
        assert revisions() == {FIRST}
        [old_core] = engine_cores()
        for client in clients:
            client.start()
        wait_until(lambda: len(answers) >= 10, "answers before the update")
        assert run(models_dir, "update", ALIAS)[0] == 0
        wait_until(lambda: revisions() == {SECOND}, "both front-ends serve the new revision")
        wait_until(lambda: old_core not in engine_cores(), "the old engine core exits")
        during = len(answers)
        wait_until(lambda: len(answers) >= during + 10, "answers from the new engine core")
        [new_core] = engine_cores()
        assert "-g1.sock" in children(server.pid)[new_core]
    finally:
        stop.set()
        for client in clients:
            if client.is_alive():
                client.join(30)
        stop_service(server)
    failed = [answer for answer in answers if answer[0] != 200]
    assert not failed, failed[:3]
    texts = {json.loads(text)["translations"][0]["text"] for _, text in answers}
    assert len(texts) == 1  # the same weights, before and after
    assert server.returncode == 0


def ready(base: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{base}/ready", timeout=2).status_code == 200
    return False


def test_remove_deletes_the_install_and_an_unknown_name_is_refused(pulled, tmp_path, capsys):
    models_dir = tmp_path / "models"
    shutil.copytree(pulled, models_dir)
    code, _, err = run(models_dir, "remove", "opus-mt-en-de", capsys=capsys)
    assert code == 1 and "opus-mt-en-de is not installed" in err and "Traceback" not in err
    assert run(models_dir, "remove", ALIAS)[0] == 0
    assert list(models_dir.iterdir()) == []
    code, out, _ = run(models_dir, "list", capsys=capsys)
    assert code == 0 and "no models" in out


# --- failures leave the models directory as it was ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("opus-en-fr", "unknown model name 'opus-en-fr'"),
        ("opus-mt-en-xx", "not in the local Hugging Face cache and the Hub cannot be reached"),
    ],
)
def test_a_bad_name_or_an_offline_miss_is_one_sentence(pulled, capsys, name, message):
    before = snapshot_of(pulled)
    code, _, err = run(pulled, "pull", name, capsys=capsys)
    assert code == 1 and message in err and "Traceback" not in err
    assert snapshot_of(pulled) == before


def seeded_variant(cache: Path, hub_id: str, checkpoint: Path, tmp_path: Path, change) -> None:
    files = tmp_path / "variant"
    shutil.copytree(checkpoint, files)
    change(files)
    seed(cache, hub_id, files, FIRST)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: (d / "source.spm").unlink(), "has no tokenizer: source.spm missing"),
        (lambda d: (d / "model.safetensors").unlink(), "has no weights"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"model_type": "t5"})),
            "is a 't5' model; this service imports marian (OPUS-MT) and m2m_100",
        ),
    ],
    ids=["no-tokenizer", "no-weights", "unsupported"],
)
def test_a_broken_checkpoint_is_refused_and_installs_nothing(
    hub_cache, checkpoint, tmp_path, capsys, change, message
):
    hub_id = f"tests/broken-{len(message)}"
    seeded_variant(hub_cache, hub_id, checkpoint[0], tmp_path, change)
    models_dir = tmp_path / "models"
    code, _, err = run(models_dir, "pull", hub_id, capsys=capsys)
    assert code == 1 and message in err and "Traceback" not in err, err
    assert not models_dir.exists()


def fail_weights_download(error: Exception):
    """huggingface_hub's snapshot_download, failing with ``error`` once the weights come."""
    import huggingface_hub

    real = huggingface_hub.snapshot_download

    def snapshot_download(repo_id, **options):
        if "model.safetensors" in options.get("allow_patterns", []):
            raise error
        return real(repo_id, **options)

    return snapshot_download


def fail_export(error: Exception):
    def export_model(*args, **kwargs):
        raise error

    return export_model


@pytest.mark.parametrize(
    ("where", "error", "message"),
    [
        ("download", ConnectionResetError("connection reset by peer"), "ConnectionResetError"),
        ("download", OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
        ("export", OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
    ],
    ids=["download-halfway", "disk-full-downloading", "disk-full-exporting"],
)
def test_a_pull_failing_halfway_installs_nothing(
    pulled, tmp_path, monkeypatch, capsys, where, error, message
):
    import huggingface_hub

    import export.onnx_export

    if where == "download":
        monkeypatch.setattr(huggingface_hub, "snapshot_download", fail_weights_download(error))
    else:
        monkeypatch.setattr(export.onnx_export, "export_model", fail_export(error))
    models_dir = tmp_path / "models"
    shutil.copytree(pulled, models_dir)
    shutil.rmtree(models_dir / ALIAS)  # installed elsewhere: this pull is a fresh one
    before = snapshot_of(models_dir)
    code, _, err = run(models_dir, "pull", ALIAS, capsys=capsys)
    assert code == 1 and message in err and "Traceback" not in err, err
    assert snapshot_of(models_dir) == before and list(models_dir.iterdir()) == []


# --- the commands' entry points ------------------------------------------------------------------


def test_python_m_service_models_dispatches_to_the_models_commands(pulled, capsys):
    assert service_main(["models", "--models-dir", str(pulled), "list"]) == 0
    assert ALIAS in capsys.readouterr().out


def test_export_of_a_hub_id_says_how_to_pull_it(tmp_path, capsys):
    from export.__main__ import main as export_main

    assert export_main(["--model", HUB_ID, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no model directory at Helsinki-NLP/opus-mt-en-fr" in err
    assert f"python -m service models pull {HUB_ID}" in err
    assert not (tmp_path / "out").exists()


def test_the_pull_and_the_exporter_share_one_variant_type():
    """The variants a pull offers are the exporter's: spelled once, in the runtime contract
    that both sides import."""
    from typing import get_args

    import export.checkpoint_build
    import service.models_cli.build
    from service.runtime.contract import Variant

    root = Path(__file__).resolve().parents[2]
    spelled = [
        path
        for folder in ("service", "export")
        for path in (root / folder).rglob("*.py")
        if '"fp32", "int8", "fp16"' in path.read_text()
    ]
    assert [path.relative_to(root).as_posix() for path in spelled] == [
        "service/runtime/contract.py"
    ]
    assert export.checkpoint_build.Variant is Variant is service.models_cli.build.Variant
    assert get_args(Variant) == ("fp32", "int8", "fp16")
