"""One NLLB-200 / M2M-100 model, many language pairs: a tiny random NLLB directory (a
SentencePiece model trained here, a random M2M-100 model) exported with ``python -m export``,
against transformers (the independent reference) at every layer: tokenizer ids, greedy and
beam ids with the forced target-language code, rows of different target languages sharing
decoder steps, and the served APIs."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from fastapi.testclient import TestClient

from export.__main__ import main as export_main
from service.config import Settings
from service.runtime.engine import Engine
from service.runtime.types import DecodeRequest
from service.text.tokenizer import NLLB_LANGUAGE_CODES, Tokenizer, nllb_language_ids
from service.translation.discovery import serving_pairs
from service.translation.exports import ModelSpec
from service.translation.languages import LanguagePair
from service.translation.routing import plan_route
from service.wiring import create_app
from tests.conftest import NLLB_TEST_CODES, build_random_nllb

PAD, EOS, UNK = 1, 2, 3
# Sentences as the pipeline sends them to the tokenizer (one sentence, no edge whitespace).
SENTENCES = [
    "Save the file",
    "Open a new window for your account",
    "Die Datei ist nicht gespeichert",
    "print copy paste undo redo search replace",
    "Einstellungen",
    "Hilfe zu Fenster und Konto 42.",
]


@pytest.fixture(scope="module")
def nllb(tmp_path_factory):
    """(transformers model, its directory, our export of it)."""
    hf_dir = tmp_path_factory.mktemp("nllb_hf")
    hf_model = build_random_nllb(hf_dir)
    export_dir = tmp_path_factory.mktemp("nllb_onnx") / "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert export_main(["--model", str(hf_dir), "--output", str(export_dir)]) == 0
    return hf_model, hf_dir, export_dir


@pytest.fixture(scope="module")
def hf_tokenizer(nllb):
    from transformers import NllbTokenizer

    return NllbTokenizer.from_pretrained(nllb[1])


@pytest.fixture(scope="module")
def engine(nllb):
    return Engine.from_dir(nllb[2], provider="cpu", intra_op_threads=1)


# --- tokenizer ---------------------------------------------------------------------------


@pytest.mark.parametrize("source", NLLB_TEST_CODES)
def test_tokenizer_ids_equal_transformers_nllb_tokenizer(nllb, hf_tokenizer, source):
    ours = Tokenizer.from_dir(nllb[1]).for_source(source)
    hf_tokenizer.src_lang = source
    for sentence in SENTENCES + ["Ünïcödé ñ 日本 ｟0｠"]:
        expected = hf_tokenizer(sentence).input_ids
        assert ours.encode_one(sentence) == expected, sentence
        assert expected[0] == hf_tokenizer.convert_tokens_to_ids(source)
        assert (
            ours.decode(expected) == hf_tokenizer.decode(expected, skip_special_tokens=True).strip()
        )
    for target in NLLB_TEST_CODES:
        assert ours.target_prefix(target) == (hf_tokenizer.convert_tokens_to_ids(target),)


def test_tokenizer_reads_the_export_and_declares_its_languages(nllb):
    import json

    tokenizer = Tokenizer.from_dir(nllb[2])
    assert tokenizer.languages == NLLB_TEST_CODES
    assert json.loads((nllb[2] / "config.json").read_text())["languages"] == list(NLLB_TEST_CODES)


def test_language_code_ids_follow_nllb_200s_dictionary():
    """Without a config that lists them, the codes follow the 256,000 pieces in NLLB's order:
    the ids facebook/nllb-200 checkpoints use (eng_Latn 256047, deu_Latn 256042, fra_Latn
    256057), and a bare list is numbered the same way."""
    ids = nllb_language_ids({}, 256_000)
    assert (ids["eng_Latn"], ids["deu_Latn"], ids["fra_Latn"]) == (256047, 256042, 256057)
    assert len(ids) == len(NLLB_LANGUAGE_CODES) == 202
    listed = nllb_language_ids({"additional_special_tokens": ["eng_Latn", "deu_Latn"]}, 100)
    assert listed == {"eng_Latn": 101, "deu_Latn": 102}


def test_m2m100_tokenizer_ids_equal_transformers_m2m100_tokenizer(nllb, tmp_path):
    """M2M-100's layout: ids from vocab.json (here a shuffled one, so that SentencePiece's own
    ids would be wrong), language codes ``__xx__`` after it in fairseq's order."""
    import json
    import random
    import shutil

    from transformers import M2M100Tokenizer

    shutil.copyfile(nllb[1] / "sentencepiece.bpe.model", tmp_path / "sentencepiece.bpe.model")
    pieces = Tokenizer.from_dir(nllb[1])._source_vocab
    ordinary = sorted(piece for piece, token_id in pieces.items() if token_id > UNK)
    random.Random(0).shuffle(ordinary)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({piece: 4 + index for index, piece in enumerate(ordinary)})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"language_codes": "m2m100"}))
    ours = Tokenizer.from_dir(tmp_path)
    assert len(ours.languages) == 100 and ours.languages[:3] == ("af", "am", "ar")
    for source in ("de", "en", "zh"):
        reference = M2M100Tokenizer(
            str(tmp_path / "vocab.json"), str(tmp_path / "sentencepiece.bpe.model"), src_lang=source
        )
        for sentence in SENTENCES:
            expected = reference(sentence).input_ids
            assert ours.for_source(source).encode_one(sentence) == expected, sentence
            # transformers 5 decodes the code as text; the service never decodes one (the
            # search strips the forced code), so the texts are compared without it
            text = reference.decode(expected[1:], skip_special_tokens=True)
            assert ours.decode(expected) == ours.decode(expected[1:]) == text
        assert ours.target_prefix(source) == (reference.get_lang_id(source),)


def test_text_that_spells_special_tokens_stays_text(nllb):
    tokenizer = Tokenizer.from_dir(nllb[1]).for_source("eng_Latn")
    ids = tokenizer.encode_one("a </s> b")
    assert ids.count(EOS) == 1 and ids[-1] == EOS


# --- decoding against transformers.generate ------------------------------------------------


def decode(engine: Engine, requests: list[DecodeRequest]) -> dict:
    """Every request admitted at once, stepped together until all finish."""
    assert not engine.add(requests)
    results = {}
    while len(results) < len(requests):
        for done in engine.step():
            results[done.request_id] = done.tokens
    return results


def hf_generate(hf_model, src_ids, forced, num_beams, max_new_tokens) -> list[int]:
    """transformers' ids, the decoder start token, the forced code and eos removed. The
    engine never generates pad or unk (its default bans): the reference bans them too."""
    with torch.no_grad():
        output = hf_model.generate(
            input_ids=torch.tensor([src_ids]),
            attention_mask=torch.ones(1, len(src_ids), dtype=torch.long),
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            forced_bos_token_id=forced,
            bad_words_ids=[[PAD], [UNK]],
            length_penalty=1.0,
            early_stopping=False,
        )[0].tolist()
    assert output[0] == EOS and output[1] == forced  # decoder start, then the forced code
    tokens = output[2:]
    return tokens[: tokens.index(EOS)] if EOS in tokens else tokens


@pytest.mark.parametrize("beam_size", [1, 4])
def test_greedy_and_beam_ids_equal_generate_with_forced_bos(nllb, engine, beam_size):
    hf_model, hf_dir, _ = nllb
    tokenizer = Tokenizer.from_dir(hf_dir)
    max_new_tokens = 16
    outputs = []
    for index, sentence in enumerate(SENTENCES):
        source, target = NLLB_TEST_CODES[index % 4], NLLB_TEST_CODES[(index + 1) % 4]
        src_ids = tokenizer.for_source(source).encode_one(sentence)
        forced = tokenizer.target_prefix(target)
        request = DecodeRequest(index, src_ids, beam_size, max_new_tokens, forced_prefix=forced)
        actual = decode(engine, [request])[index]
        expected = hf_generate(hf_model, src_ids, forced[0], beam_size, max_new_tokens)
        assert actual == expected, (sentence, source, target)
        outputs.append(actual)
    # Meaningful only if outputs differ by input and some end on eos before the limit.
    assert len({tuple(tokens) for tokens in outputs}) > 1
    assert any(len(tokens) < max_new_tokens - 1 for tokens in outputs)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_batch_mixing_three_target_languages_equals_each_row_alone(nllb, engine, beam_size):
    tokenizer = Tokenizer.from_dir(nllb[1])
    src_ids = tokenizer.for_source("eng_Latn").encode_one(SENTENCES[1])
    requests = [
        DecodeRequest(target, src_ids, beam_size, 12, forced_prefix=tokenizer.target_prefix(target))
        for target in NLLB_TEST_CODES[1:]
    ]
    assert not engine.add(requests)
    assert engine.groups == 1 and engine.active_requests == 3  # one batch, shared steps
    together = {}
    while len(together) < 3:
        together.update((done.request_id, done.tokens) for done in engine.step())
    alone = {
        request.request_id: decode(engine, [request])[request.request_id] for request in requests
    }
    assert together == alone
    assert len({tuple(tokens) for tokens in together.values()}) == 3  # the code steers each row


# --- routing -----------------------------------------------------------------------------


def test_one_model_serves_every_pair_of_its_languages_and_a_pair_model_wins_its_pair():
    nllb = ModelSpec("nllb", None, "en", "de", ("en", "de", "fr", "ace_Arab"))
    de_fr = ModelSpec("de-fr", None, "de", "fr")
    pairs = serving_pairs([nllb, de_fr])
    assert len(pairs) == 12 and pairs[("de", "fr")] == "de-fr" and pairs[("fr", "de")] == "nllb"
    en_ja = {("en", "ja"): "en-ja"}
    route = plan_route(
        LanguagePair.parse("deu_Latn", "ja"), {**pairs, **en_ja}, "en"
    )  # pivot: no model has de→ja
    assert route.legs == ("nllb", "en-ja") and route.leg_pairs == (("de", "en"), ("en", "ja"))
    assert (route.shown_source, route.shown_target) == ("deu_Latn", "ja")
    route = plan_route(LanguagePair.parse("ACE_ARAB", "fra_Latn"), pairs, "en")
    assert route.legs == ("nllb",) and (route.source, route.target) == ("ace_Arab", "fr")
    assert (route.shown_source, route.shown_target) == ("ace_Arab", "fra_Latn")


# --- served end to end -------------------------------------------------------------------

MAX_NEW = 20


@pytest.fixture(scope="module")
def client(nllb):
    settings = Settings(
        exports=[nllb[2]],
        provider="cpu",
        intra_op_threads=1,
        max_new_tokens=MAX_NEW,
        output_length_slack=MAX_NEW,  # every sentence may take MAX_NEW tokens, as generate
    )
    with TestClient(create_app(settings)) as test_client:
        for _ in range(600):
            if test_client.get("/ready").status_code == 200:
                break
            time.sleep(0.05)
        yield test_client


def expected_text(nllb, hf_tokenizer, sentence, source, target) -> str:
    """transformers end to end: tokenize, greedy generate with the forced code, decode."""
    hf_model = nllb[0]
    hf_tokenizer.src_lang = source
    src_ids = hf_tokenizer(sentence).input_ids
    forced = hf_tokenizer.convert_tokens_to_ids(target)
    ids = hf_generate(hf_model, src_ids, forced, 1, MAX_NEW + 1)  # + 1: the forced code
    return hf_tokenizer.decode(ids, skip_special_tokens=True).strip()


def test_languages_lists_every_pair_of_the_models_languages(client):
    languages = client.get("/languages").json()
    iso = ["de", "en", "es", "fr"]
    assert [entry["code"] for entry in languages] == iso
    for entry in languages:
        assert entry["targets"] == [code for code in iso if code != entry["code"]]


@pytest.mark.parametrize(
    ("source", "target", "nllb_source", "nllb_target"),
    [("de", "fr", "deu_Latn", "fra_Latn"), ("en", "es", "eng_Latn", "spa_Latn")],
)
def test_v1_and_libretranslate_with_iso_codes_equal_transformers(
    nllb, hf_tokenizer, client, source, target, nllb_source, nllb_target
):
    texts = [s for s in SENTENCES if not s.endswith(".")][:4]
    expected = [expected_text(nllb, hf_tokenizer, s, nllb_source, nllb_target) for s in texts]
    body = client.post(
        "/v1/translate",
        json={
            "text": texts,
            "source_lang": source,
            "target_lang": target,
            "max_new_tokens": MAX_NEW,
        },
    ).json()
    assert [t["text"] for t in body["translations"]] == expected
    assert (body["source_lang"], body["target_lang"]) == (source, target)
    libre = client.post("/translate", json={"q": texts, "source": source, "target": target})
    assert libre.status_code == 200 and libre.json()["translatedText"] == expected
    # NLLB's codes reach the same translation, and the response spells them back that way.
    spelt = client.post(
        "/v1/translate",
        json={
            "text": texts,
            "source_lang": nllb_source,
            "target_lang": nllb_target,
            "max_new_tokens": MAX_NEW,
        },
    ).json()
    assert [t["text"] for t in spelt["translations"]] == expected
    assert (spelt["source_lang"], spelt["target_lang"]) == (nllb_source, nllb_target)


def test_one_request_per_target_language_gives_different_translations(client):
    texts = {
        target: client.post(
            "/v1/translate",
            json={
                "text": SENTENCES[0],
                "source_lang": "en",
                "target_lang": target,
                "max_new_tokens": MAX_NEW,
            },
        ).json()["translations"][0]["text"]
        for target in ("de", "fr", "es")
    }
    assert len(set(texts.values())) == 3


def test_a_language_the_model_lacks_is_refused_with_4xx(client):
    response = client.post(
        "/v1/translate", json={"text": "x", "source_lang": "en", "target_lang": "jpn_Jpan"}
    )
    assert response.status_code in (400, 422) and "ja is not supported" in response.text


def test_detection_chooses_among_the_models_languages(nllb, hf_tokenizer, client):
    text = "Die Datei ist nicht gespeichert"
    body = client.post(
        "/v1/translate",
        json={"text": text, "source_lang": "auto", "target_lang": "fr", "max_new_tokens": MAX_NEW},
    ).json()
    assert body["detected_language"]["language"] == "de" and body["source_lang"] == "de"
    expected = expected_text(nllb, hf_tokenizer, text, "deu_Latn", "fra_Latn")
    assert body["translations"][0]["text"] == expected


def test_models_lists_the_languages_of_a_multilingual_model(client):
    [card] = client.get("/v1/models").json()["data"]
    assert card["languages"] == ["en", "de", "fr", "es"]


def test_an_export_with_external_data_decodes_as_the_inline_one(
    nllb, engine, tmp_path, monkeypatch
):
    """NLLB-200-600M's graphs pass protobuf's 2 GiB: their weights go to ``*.onnx.data``. The
    tiny model, exported that way on purpose, decodes exactly as its inline export, in fp32
    and through the int8 variant."""
    from export.onnx_export import export_model
    from export.variants import make_int8
    from models.checkpoint import load_pretrained

    hf_dir, inline_dir = nllb[1], nllb[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        external_dir = export_model(
            load_pretrained(hf_dir), tmp_path / "fp32", tokenizer_dir=hf_dir, external_data=True
        )
    assert (external_dir / "decoder.onnx.data").exists()
    assert (external_dir / "decoder.onnx").stat().st_size < 200_000  # the graph without weights
    tokenizer = Tokenizer.from_dir(hf_dir)
    requests = [
        DecodeRequest(
            index,
            tokenizer.for_source("eng_Latn").encode_one(sentence),
            1,
            12,
            forced_prefix=tokenizer.target_prefix("spa_Latn"),
        )
        for index, sentence in enumerate(SENTENCES)
    ]
    expected = decode(engine, requests)
    external = Engine.from_dir(external_dir, provider="cpu", intra_op_threads=1)
    assert decode(external, requests) == expected
    int8 = {"inline": make_int8(inline_dir, tmp_path / "inline-int8")}
    # As if every graph passed 2 GiB: the quantizer reads and writes external data too.
    monkeypatch.setattr("export.variants.EXTERNAL_DATA_BYTES", 0)
    monkeypatch.setattr("export.onnx_export.EXTERNAL_DATA_BYTES", 0)
    int8["external"] = make_int8(external_dir, tmp_path / "external-int8")
    assert (int8["external"] / "decoder.onnx.data").exists()
    assert not (int8["inline"] / "decoder.onnx.data").exists()
    outputs = {
        name: decode(Engine.from_dir(path, provider="cpu", intra_op_threads=1), requests)
        for name, path in int8.items()
    }
    assert outputs["external"] == outputs["inline"]


def test_discovery_reads_the_languages_of_a_multilingual_export(nllb, tmp_path):
    import json

    from service.translation.discovery import discover_models

    pair_dir = tmp_path / "de-fr"
    pair_dir.mkdir()
    (pair_dir / "config.json").write_text(json.dumps({"source_lang": "de", "target_lang": "fr"}))
    multilingual, pair = discover_models([nllb[2], pair_dir], None)
    assert multilingual.languages == ("en", "de", "fr", "es") and not pair.languages
    served = serving_pairs([multilingual, pair])
    assert served[("de", "fr")] == pair.model_id and served[("fr", "de")] == multilingual.model_id
    assert len(served) == 12
