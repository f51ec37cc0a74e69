"""The evaluation translates through the service's text pipeline: what it scores is what the
service serves, sentence splitting, placeholders, budgets and refusals included."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from models.training.corpus import Pair, write_tsv
from models.training.evaluate import engine_decoder, evaluate, translate_with
from service.config import Settings
from service.runtime.engine import Engine
from service.text.tokenizer import Tokenizer
from service.wiring import create_app
from tests.service_fixtures import tiny_model

TEXTS = [
    "Save changes. Open the file in a new window.",
    "<b>Delete</b> all files in %s",
    "   ",
    "Print this folder with your account",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def test_evaluation_gives_the_translations_the_service_serves(model_dir):
    settings = Settings(exports=[model_dir], provider="cpu", intra_op_threads=1)
    with TestClient(create_app(settings)) as client:
        for _ in range(600):
            if client.get("/ready").status_code == 200:
                break
            time.sleep(0.05)
        served = client.post("/v1/translate", json={"text": TEXTS, "source_lang": "en"}).json()
        too_long = client.post("/v1/translate", json={"text": "save " * 300})
    engine = Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1)
    evaluated, refused = translate_with(
        engine_decoder(engine, beam_size=1, constrain_placeholders=True),
        Tokenizer.from_dir(model_dir),
        [*TEXTS, "save " * 300],
        model_positions=engine.model.info.max_positions,
    )
    assert evaluated[: len(TEXTS)] == [t["text"] for t in served["translations"]]
    assert too_long.status_code == 413
    assert evaluated[-1] == "" and refused == 1  # what the service refuses scores as nothing


def test_evaluating_an_export_scores_the_engines_translations(model_dir, tmp_path):
    pairs = [Pair(text, text, "debian:x", "GPL") for text in TEXTS if text.strip()]
    write_tsv(pairs, tmp_path / "test-general.tsv")
    engine = Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1)
    expected, _ = translate_with(
        engine_decoder(engine, beam_size=1, constrain_placeholders=False),
        Tokenizer.from_dir(model_dir),
        [pair.source for pair in pairs],
        model_positions=engine.model.info.max_positions,
    )
    result = evaluate(model_dir, tmp_path, 1, None, model_dir, split="test-general")
    assert result["backend"].startswith("onnxruntime")
    assert result["test_pairs"] == len(pairs)
    assert [example["translation"] for example in result["examples"]] == expected
