"""``python -m service models pull m2m100_418M``: a many-language checkpoint from a pre-seeded
Hugging Face cache, offline (``HF_HUB_OFFLINE=1``).

The cache holds a tiny random ``M2M100ForConditionalGeneration`` and an ``M2M100Tokenizer``
(a SentencePiece model trained here, ``vocab.json``), both saved by transformers with
``save_pretrained``, under the real model's id. The pull installs it with every language its
tokenizer has codes for, and it translates as transformers' ``generate`` does on the same
weights with the target language's code forced first.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.models_cli import main as models_main
from service.models_cli.store import MANIFEST_FILE
from service.text.tokenizer import M2M100_LANGUAGE_CODES, Tokenizer
from service.wiring import create_app
from tests.conftest import build_random_m2m100
from tests.hub_cache import pull_offline, seed, use_offline
from tests.ready import wait_ready

ALIAS = "m2m100_418M"
HUB_ID = "facebook/m2m100_418M"
COMMIT = hashlib.sha1(b"m2m100 tiny").hexdigest()
PIECES = 120  # SentencePiece pieces, <unk>, <s> and </s> among them
MADEUP_WORDS = 8  # M2M100Tokenizer's madeup words follow the language codes in the table
PAD, EOS, UNK = 1, 2, 3
MAX_NEW = 12
TEXTS = {("en", "fr"): "Save the file", ("de", "en"): "Die Datei ist nicht gespeichert"}


def tiny_m2m100(directory: Path):
    """The checkpoint's files as transformers saves them; returns (directory, model,
    tokenizer)."""
    import sentencepiece as spm
    from transformers import M2M100Tokenizer

    from tests.service_fixtures import _training_sentences

    directory.mkdir(parents=True)
    work = directory.parent / "spm"
    work.mkdir()
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_sentences()),
        model_writer=model_bytes,
        model_type="bpe",
        vocab_size=PIECES,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    (work / "sentencepiece.bpe.model").write_bytes(model_bytes.getvalue())
    pieces = spm.SentencePieceProcessor(model_proto=model_bytes.getvalue())
    vocab = {"<s>": 0, "<pad>": PAD, "</s>": EOS, "<unk>": UNK}
    for piece_id in range(3, PIECES):  # after SentencePiece's <unk>, <s>, </s>
        vocab[pieces.id_to_piece(piece_id)] = len(vocab)
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = M2M100Tokenizer(str(work / "vocab.json"), str(work / "sentencepiece.bpe.model"))
    tokenizer.save_pretrained(directory)
    codes = len(M2M100_LANGUAGE_CODES["m2m100"])
    model = build_random_m2m100(directory, vocab_size=len(vocab) + codes + MADEUP_WORDS)
    (directory / "README.md").write_text("---\nlicense: mit\n---\n# m2m100_418M\n")
    return directory, model, tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_m2m100(tmp_path_factory.mktemp("m2m100") / "checkpoint")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, checkpoint):
    cache = tmp_path_factory.mktemp("hf_home") / "hub"
    seed(cache, HUB_ID, checkpoint[0], COMMIT)
    return cache


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch, hub_cache):
    use_offline(monkeypatch, hub_cache)


@pytest.fixture(scope="module")
def pulled(tmp_path_factory, hub_cache):
    """The models directory after ``pull m2m100_418M``."""
    return pull_offline(hub_cache, tmp_path_factory.mktemp("models"), ALIAS)


def test_pull_by_alias_installs_every_language_the_tokenizer_has(pulled, capsys):
    manifest = json.loads((pulled / ALIAS / MANIFEST_FILE).read_text())
    every = list(M2M100_LANGUAGE_CODES["m2m100"])
    assert (manifest["hub_id"], manifest["revision"]) == (HUB_ID, COMMIT)
    assert (manifest["architecture"], manifest["licence"]) == ("m2m_100", "mit")
    assert manifest["languages"] == every
    assert json.loads((pulled / ALIAS / "config.json").read_text())["languages"] == every
    assert models_main(["--models-dir", str(pulled), "list"]) == 0
    assert f"{len(every)} languages" in capsys.readouterr().out


def test_pull_by_hub_id_names_the_same_install(pulled, capsys):
    assert models_main(["--models-dir", str(pulled), "pull", HUB_ID]) == 0
    assert "installed already" in capsys.readouterr().out
    assert sorted(path.name for path in pulled.iterdir()) == [ALIAS]


def generate(model, tokenizer, text: str, source: str, target: str) -> list[int]:
    """transformers' greedy ids after the forced target code, up to eos. The service never
    generates pad or unk: the reference bans them too."""
    import torch

    tokenizer.src_lang = source
    ids = torch.tensor([tokenizer(text).input_ids])
    with torch.no_grad():
        output = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            num_beams=1,
            do_sample=False,
            max_new_tokens=MAX_NEW,
            forced_bos_token_id=tokenizer.get_lang_id(target),
            bad_words_ids=[[PAD], [UNK]],
        )[0].tolist()
    assert output[:2] == [EOS, tokenizer.get_lang_id(target)]  # decoder start, forced code
    tokens = output[2:]
    return tokens[: tokens.index(EOS)] if EOS in tokens else tokens


def test_the_pulled_model_translates_as_transformers_generates(pulled, checkpoint):
    _, model, hf_tokenizer = checkpoint
    ours = Tokenizer.from_dir(pulled / ALIAS)
    settings = Settings(
        models_dir=pulled, provider="cpu", intra_op_threads=1, language_detection=False
    )
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        languages = {entry["code"] for entry in client.get("/languages").json()}
        assert languages == set(M2M100_LANGUAGE_CODES["m2m100"])
        for (source, target), text in TEXTS.items():
            generated = generate(model, hf_tokenizer, text, source, target)
            assert len(generated) >= 2, generated  # a translation, not an eos at once
            expected = ours.decode(generated)
            body = {
                "text": text,
                "source_lang": source,
                "target_lang": target,
                "max_new_tokens": MAX_NEW,
            }
            response = client.post("/v1/translate", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["translations"][0]["text"] == expected, (source, target)
        libre = client.post(
            "/translate", json={"q": TEXTS["en", "fr"], "source": "en", "target": "fr"}
        )
        direct = client.post(
            "/v1/translate",
            json={"text": TEXTS["en", "fr"], "source_lang": "en", "target_lang": "fr"},
        )
        assert libre.status_code == 200, libre.text
        assert libre.json()["translatedText"] == direct.json()["translations"][0]["text"]
