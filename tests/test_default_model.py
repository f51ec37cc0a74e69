"""The shipped default model (models/default), exported and served through the real app.

The expectations are what a German speaker accepts for these interface strings: the key words
must be there (any of the usual renderings), placeholders and markup must come back intact.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "default"

pytestmark = pytest.mark.skipif(
    not (DEFAULT_MODEL / "model.safetensors").exists(), reason="models/default is not shipped yet"
)

# English -> groups of acceptable German words; every group must match (case-insensitive).
EXPECTATIONS = {
    "Save changes": [r"änderungen", r"speichern"],
    "Open file": [r"datei", r"öffnen"],
    "Cancel": [r"abbrechen"],
    "Settings": [r"einstellungen"],
    "Delete the selected files?": [r"datei", r"löschen|entfernen", r"\?"],
    "Password": [r"passwort|kennwort"],
    "The file could not be opened.": [r"datei", r"nicht", r"geöffnet|öffnen"],
}

PLACEHOLDER_TEXTS = [
    "%d files copied",
    "Delete %(name)s?",
    "Welcome, {0}!",
    "Click <b>Save</b> to continue.",
]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from export.onnx_export import export_from_dir

    onnx_dir = tmp_path_factory.mktemp("default_onnx")
    export_from_dir(DEFAULT_MODEL, onnx_dir)
    settings = Settings(model_dir=onnx_dir, provider="cpu", intra_op_threads=1)
    with TestClient(create_app(settings)) as test_client:
        for _ in range(600):
            if test_client.get("/ready").status_code == 200:
                break
            time.sleep(0.1)
        yield test_client


def translate(client: TestClient, texts: list[str], beam_size: int = 1) -> list[str]:
    response = client.post("/v1/translate", json={"text": texts, "beam_size": beam_size})
    assert response.status_code == 200, response.text
    return [item["text"] for item in response.json()["translations"]]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_interface_strings_translate_to_acceptable_german(client, beam_size):
    sources = list(EXPECTATIONS)
    for source, translation in zip(sources, translate(client, sources, beam_size), strict=True):
        for pattern in EXPECTATIONS[source]:
            assert re.search(pattern, translation, re.IGNORECASE), f"{source!r} -> {translation!r}"


def test_placeholders_and_markup_survive(client):
    for source, translation in zip(
        PLACEHOLDER_TEXTS, translate(client, PLACEHOLDER_TEXTS), strict=True
    ):
        for token in re.findall(r"%\(\w+\)s|%d|\{0\}|</?b>", source):
            assert token in translation, f"{source!r} -> {translation!r}"
        assert translation != source  # translated, not copied


def test_libretranslate_route_serves_the_default_model(client):
    response = client.post("/translate", json={"q": "Save changes", "source": "en", "target": "de"})
    assert response.status_code == 200
    assert re.search("speichern", response.json()["translatedText"], re.IGNORECASE)
