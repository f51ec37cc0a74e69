"""Shared fixtures: small random Hugging Face Marian and M2M-100 checkpoints built offline."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# tests/onnx_fixtures.py is a plugin of the test modules that use its session fixture, and some
# of them also import from it: marked here, it is rewritten whichever folder pytest collects first.
pytest.register_assert_rewrite("tests.onnx_fixtures")

EOS_BIAS = 9.0

TINY_MARIAN = dict(
    vocab_size=96,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=128,
    activation_function="swish",
    scale_embedding=True,
    pad_token_id=95,
    eos_token_id=0,
    decoder_start_token_id=95,
    forced_eos_token_id=None,
    # A larger init than the default 0.02 makes outputs depend on the input (docs/toolchain.md).
    init_std=0.5,
)


def build_random_marian(output_dir, seed: int = 0, **overrides):
    """Save a random MarianMTModel (untied LM head, non-zero logits bias) and return it."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    config = MarianConfig(**{**TINY_MARIAN, **overrides})
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        # Favour eos, so that hypotheses end at varied lengths and finished beams compete.
        bias = torch.randn_like(model.final_logits_bias)
        bias[0, config.eos_token_id] += EOS_BIAS
        model.final_logits_bias.copy_(bias)
    model.save_pretrained(output_dir)
    return model


# The last LANGUAGE_CODES ids of TINY_M2M100's vocabulary stand for language codes, as NLLB's
# ~200 codes follow its SentencePiece pieces.
LANGUAGE_CODES = 4

TINY_M2M100 = dict(
    vocab_size=64,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    activation_function="relu",
    scale_embedding=True,
    # the fairseq dictionary's ids: <s>=0, <pad>=1, </s>=2, <unk>=3
    bos_token_id=0,
    pad_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=None,
    tie_word_embeddings=True,
    init_std=0.5,  # outputs that depend on the input, as for TINY_MARIAN
)


def build_random_m2m100(output_dir, seed: int = 2, eos_boost: float = 2.5, **overrides):
    """Save a random M2M100ForConditionalGeneration (one tied table, no logits bias) and
    return it. The </s> row of the table is scaled by ``eos_boost`` so that generations end
    at varied lengths: M2M-100 has no logits bias to favour it with."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    torch.manual_seed(seed)
    config = M2M100Config(**{**TINY_M2M100, **overrides})
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        table = model.get_input_embeddings().weight  # (V, D), shared with the LM head
        table[config.pad_token_id] = 0.0
        table[config.eos_token_id] *= eos_boost
    model.save_pretrained(output_dir)
    return model


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory):
    """A random Marian checkpoint with an untied LM head."""
    path = tmp_path_factory.mktemp("marian_untied")
    build_random_marian(path, tie_word_embeddings=False)
    return path


# The languages of build_random_nllb's tokenizer, in NLLB's spelling; ISO 639-1 en, de, fr, es.
NLLB_TEST_CODES = ("eng_Latn", "deu_Latn", "fra_Latn", "spa_Latn")
NLLB_PIECES = 120  # SentencePiece pieces; the model's table adds the codes and <mask>


def build_random_nllb(output_dir, seed: int = 2, codes=NLLB_TEST_CODES):
    """An NLLB-200 directory in miniature: a BPE SentencePiece model trained here
    (``sentencepiece.bpe.model``), a ``tokenizer_config.json`` as transformers saves NLLB's
    (``added_tokens_decoder``: fairseq's specials, then the language codes after the pieces,
    then ``<mask>``), and a random M2M-100 model whose table has exactly those ids. Returns
    the transformers model."""
    import io
    import json
    from pathlib import Path

    import sentencepiece as spm

    from tests.service_fixtures import _training_sentences

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_sentences()),
        model_writer=model_bytes,
        model_type="bpe",
        vocab_size=NLLB_PIECES,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )  # SentencePiece's defaults: <unk>=0, <s>=1, </s>=2, as NLLB's model has them
    (output_dir / "sentencepiece.bpe.model").write_bytes(model_bytes.getvalue())
    specials = [(0, "<s>"), (1, "<pad>"), (2, "</s>"), (3, "<unk>")]
    after_pieces = [(NLLB_PIECES + 1 + index, code) for index, code in enumerate(codes)]
    mask = [(NLLB_PIECES + 1 + len(codes), "<mask>")]
    decoder = {
        str(token_id): {
            "content": content,
            "lstrip": content == "<mask>",
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token_id, content in specials + after_pieces + mask
    }
    config = {
        "tokenizer_class": "NllbTokenizer",
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(codes),
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
        "src_lang": codes[0],
        "tgt_lang": codes[1],
        "model_max_length": 1024,
    }
    (output_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return build_random_m2m100(output_dir, seed=seed, vocab_size=NLLB_PIECES + len(codes) + 2)


@pytest.fixture(scope="session")
def postgres_server():
    """The URL of a PostgreSQL server for this session (tests/postgres_server.py), or a skip
    that says why none could be started."""
    from tests.postgres_server import server

    try:
        with server() as url:
            yield url
    except RuntimeError as error:
        pytest.skip(f"no PostgreSQL server: {error}")


@pytest.fixture()
def postgres_url(postgres_server):
    """A fresh, empty PostgreSQL database for one test (dropped after it)."""
    from tests.postgres_server import fresh_database

    with fresh_database(postgres_server) as url:
        yield url


@pytest.fixture(scope="module", params=["single", "multi"])
def process_mode(request) -> str:
    """``MT_PROCESS_MODE`` of the service a module's tests run against: each test that takes
    it (or a fixture that does) runs in both, one server per mode and module
    (tests/servers.py)."""
    return request.param
