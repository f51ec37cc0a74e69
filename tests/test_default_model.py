"""The shipped default models (models/default: English→German, models/de-en: German→English),
exported and served together through the real app, as `make serve` serves them.

The expectations are what a speaker of the target language accepts for these interface strings:
the key words must be there (any of the usual renderings), placeholders and markup must come
back intact, and the text must be translated, not copied.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.wiring import create_app

MODELS = Path(__file__).resolve().parents[1] / "models"
SHIPPED = {("en", "de"): MODELS / "default", ("de", "en"): MODELS / "de-en"}

pytestmark = pytest.mark.skipif(
    not all((model / "model.safetensors").exists() for model in SHIPPED.values()),
    reason="the default models are not shipped yet",
)

# Source -> groups of acceptable target words; every group must match (case-insensitive).
EXPECTATIONS = {
    ("en", "de"): {
        "Save changes": [r"änderungen", r"speichern"],
        "Open file": [r"datei", r"öffnen"],
        "Cancel": [r"abbrechen"],
        "Settings": [r"einstellungen"],
        "Delete the selected files?": [r"datei", r"löschen|entfernen", r"\?"],
        "Password": [r"passwort|kennwort"],
        "The file could not be opened.": [r"datei", r"nicht", r"geöffnet|öffnen"],
    },
    ("de", "en"): {
        "Änderungen speichern": [r"save", r"changes"],
        "Datei öffnen": [r"open", r"file"],
        "Abbrechen": [r"cancel|abort"],
        "Einstellungen": [r"settings|preferences|options"],
        "Ausgewählte Dateien löschen?": [r"delete|remove", r"selected", r"files", r"\?"],
        "Passwort": [r"password"],
        "Die Datei konnte nicht geöffnet werden.": [r"file", r"not|n't", r"open"],
    },
}

PLACEHOLDER_TEXTS = {
    ("en", "de"): [
        "%d files copied",
        "Delete %(name)s?",
        "Welcome, {0}!",
        "Click <b>Save</b> to continue.",
    ],
    ("de", "en"): [
        "%d Dateien kopiert",
        "%(name)s löschen?",
        "Willkommen, {0}!",
        "Klicken Sie auf <b>Speichern</b>, um fortzufahren.",
    ],
}
PAIRS = list(SHIPPED)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from export.onnx_export import export_from_dir

    onnx_dirs = []
    for (source, target), model_dir in SHIPPED.items():
        onnx_dir = tmp_path_factory.mktemp(f"onnx_{source}_{target}")
        export_from_dir(model_dir, onnx_dir)
        onnx_dirs.append(onnx_dir)
    settings = Settings(model_dirs=onnx_dirs, provider="cpu", intra_op_threads=1)
    with TestClient(create_app(settings)) as test_client:
        for _ in range(600):
            if test_client.get("/ready").status_code == 200:
                break
            time.sleep(0.1)
        yield test_client


def translate(
    client: TestClient, pair: tuple[str, str], texts: list[str], beam_size: int = 1
) -> list[str]:
    source, target = pair
    response = client.post(
        "/v1/translate",
        json={
            "text": texts,
            "source_lang": source,
            "target_lang": target,
            "beam_size": beam_size,
        },
    )
    assert response.status_code == 200, response.text
    return [item["text"] for item in response.json()["translations"]]


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: "-".join(pair))
def test_interface_strings_translate_to_acceptable_words(client, pair, beam_size):
    expectations = EXPECTATIONS[pair]
    sources = list(expectations)
    for source, translation in zip(
        sources, translate(client, pair, sources, beam_size), strict=True
    ):
        for pattern in expectations[source]:
            assert re.search(pattern, translation, re.IGNORECASE), f"{source!r} -> {translation!r}"


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: "-".join(pair))
def test_placeholders_and_markup_survive(client, pair):
    texts = PLACEHOLDER_TEXTS[pair]
    for source, translation in zip(texts, translate(client, pair, texts), strict=True):
        for token in re.findall(r"%\(\w+\)s|%d|\{0\}|</?b>", source):
            assert token in translation, f"{source!r} -> {translation!r}"
        assert translation != source  # translated, not copied


def test_both_directions_are_listed_and_routed_by_the_libretranslate_api(client):
    languages = {item["code"]: set(item["targets"]) for item in client.get("/languages").json()}
    assert "de" in languages["en"] and "en" in languages["de"]
    to_german = client.post(
        "/translate", json={"q": "Save changes", "source": "en", "target": "de"}
    )
    assert to_german.status_code == 200
    assert re.search("speichern", to_german.json()["translatedText"], re.IGNORECASE)
    to_english = client.post(
        "/translate", json={"q": "Änderungen speichern", "source": "de", "target": "en"}
    )
    assert to_english.status_code == 200
    assert re.search("save", to_english.json()["translatedText"], re.IGNORECASE)
