"""A tiny real model for service tests: random Marian weights, a SentencePiece tokenizer
trained in memory, exported to ONNX once per session.

The translations are nonsense, but they come from the real export and the real engine, so
the API, batching and batch-invariance tests exercise the code that serves production.
Importing this module is cheap; torch and the exporter load only when the fixture runs.
"""

from __future__ import annotations

import io
import itertools
import json
import string
from pathlib import Path

import pytest

from tests.conftest import build_random_marian

VOCAB_SIZE = 160
SOURCE_LANG, TARGET_LANG = "en", "de"
# The logits bias of eos: with this seed some sentences end after a few tokens and others run
# to their max_new_tokens, so batches mix short and long rows (conftest's default of 9 ends
# nearly every sentence at once).
EOS_BIAS = 7.5

_WORD_LIST = (
    "save open close file files edit view help settings changes cancel delete new name "
    "folder print copy paste undo redo search replace window tools about exit user password "
    "login account the a an of to in for on with your this that is are was were not all "
    "speichern öffnen schließen datei bearbeiten ansicht hilfe einstellungen änderungen "
    "abbrechen löschen neu ordner drucken kopieren einfügen suchen ersetzen fenster konto "
    "der die das ein eine von zu für mit ist sind nicht alle"
)
_WORDS = _WORD_LIST.split()


def _training_sentences() -> list[str]:
    """A few hundred deterministic sentences: enough text for a unigram model of VOCAB_SIZE."""
    sentences = []
    for index, (first, second, third) in enumerate(
        itertools.product(_WORDS[:24], _WORDS[24:36], _WORDS[-20:])
    ):
        if index % 7 == 0:
            sentences.append(f"{first.capitalize()} {second} {third} {index % 100}.")
    sentences += [" ".join(_WORDS[start : start + 9]) for start in range(len(_WORDS))]
    return sentences


def train_tiny_tokenizer(
    output_dir: Path, vocab_size: int = VOCAB_SIZE, placeholder_symbols: bool = True
) -> None:
    """Write a Marian-layout tokenizer (source.spm, target.spm, vocab.json, config) with the
    default model's id convention: ``</s>`` = 0, ``<unk>`` = 1, placeholders, ``<pad>`` last.
    ``placeholder_symbols=False``: no ``｟k｠`` pieces, as in an imported OPUS-MT vocabulary."""
    import sentencepiece as spm

    from service.text.placeholders import PLACEHOLDER_SYMBOLS

    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_sentences()),
        model_writer=model_bytes,
        model_type="unigram",
        vocab_size=vocab_size,
        eos_id=0,
        unk_id=1,
        bos_id=-1,
        pad_id=vocab_size - 1,
        eos_piece="</s>",
        unk_piece="<unk>",
        pad_piece="<pad>",
        user_defined_symbols=list(PLACEHOLDER_SYMBOLS) if placeholder_symbols else [],
        # Every printable ASCII character, so English test texts are spelled by the model
        # and only what a real model lacks (emoji, other scripts) is protected from it.
        required_chars=string.ascii_letters + string.digits + string.punctuation,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_proto=model_bytes.getvalue())
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "source.spm").write_bytes(model_bytes.getvalue())
    (output_dir / "target.spm").write_bytes(model_bytes.getvalue())
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    (output_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    config = {
        "source_lang": SOURCE_LANG,
        "target_lang": TARGET_LANG,
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "separate_vocabs": False,
    }
    (output_dir / "tokenizer_config.json").write_text(json.dumps(config))


def export_tiny_model(root: Path, eos_bias: float | None = EOS_BIAS) -> Path:
    """Random Marian model + tiny tokenizer → ONNX export dir (returned)."""
    import torch

    from export.onnx_export import export_model
    from models.checkpoint import load_pretrained

    marian_dir = root / "marian"
    hf_model = build_random_marian(
        marian_dir,
        seed=3,
        vocab_size=VOCAB_SIZE,
        pad_token_id=VOCAB_SIZE - 1,
        decoder_start_token_id=VOCAB_SIZE - 1,
        tie_word_embeddings=False,
    )
    if eos_bias is not None:
        with torch.no_grad():
            hf_model.final_logits_bias[0, 0] = eos_bias
        hf_model.save_pretrained(marian_dir)
    train_tiny_tokenizer(marian_dir)
    onnx_dir = root / "onnx"
    export_model(
        load_pretrained(marian_dir), onnx_dir, tokenizer_dir=marian_dir, model_name="tiny-random"
    )
    return onnx_dir


_exported: dict[str, Path] = {}


def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's ONNX export dir, built on first use and shared by the whole session
    (test modules wrap this in a fixture of their own name)."""
    if "tiny" not in _exported:
        _exported["tiny"] = export_tiny_model(tmp_path_factory.mktemp("tiny_mt"))
    return _exported["tiny"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """ONNX export dir of the tiny random model with its tokenizer files."""
    return tiny_model(tmp_path_factory)


def solo_translator(model_dir: Path):
    """``translate(sentence, max_new_tokens, beam_size=1)``: the engine's translation of one
    sentence alone, placeholders and what the model cannot spell masked, constrained and
    restored as the service does: the reference that API and concurrency tests compare the
    service against."""
    from service.runtime.engine import Engine
    from service.text.pipeline import copy_tokens_for, has_words
    from service.text.protection import RunProtector, placeholder_token_ids, restore_every_run
    from service.text.tokenizer import Tokenizer

    engine = Engine.from_dir(model_dir, provider="cpu", intra_op_threads=1)
    tokenizer = Tokenizer.from_dir(model_dir)
    symbol_ids = placeholder_token_ids(tokenizer)
    protector = RunProtector(tokenizer)

    def translate(sentence: str, max_new_tokens: int, beam_size: int = 1) -> str:
        masked, originals = protector.protect(sentence)
        if not has_words(masked):
            return sentence  # the service passes it through without the model
        src_ids = tokenizer.encode_one(masked)
        [tokens] = engine.translate_ids(
            [src_ids],
            beam_size=beam_size,
            max_new_tokens=max_new_tokens,
            copy_tokens=[copy_tokens_for(src_ids, symbol_ids)],
        )
        return restore_every_run(tokenizer.decode(tokens), originals, masked)

    return translate


def only_model(app):
    """The loaded model of an app that serves one model (its engine, batcher, translator)."""
    [slot] = app.state.service.registry.slots.values()
    return slot.model


# The three language pairs of the multi-model tests. One export serves as all three (an
# export takes most of a minute on these machines): each copy declares its own pair and name,
# and the copies other than en→de get a different final logits bias, so the three models
# translate one input differently and a test can tell which one ran.
LANGUAGE_PAIRS = (("en", "de"), ("de", "en"), ("en", "fr"))


def language_models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """(source, target) -> export dir of a tiny model declaring that pair (session-wide)."""
    if "pairs" not in _exported:
        root = tmp_path_factory.mktemp("tiny_pairs")
        base = tiny_model(tmp_path_factory)
        for seed, (source, target) in enumerate(LANGUAGE_PAIRS):
            _exported[f"{source}-{target}"] = _copy_as_pair(base, root, source, target, seed)
        _exported["pairs"] = root
    return {pair: _exported[f"{pair[0]}-{pair[1]}"] for pair in LANGUAGE_PAIRS}


def _copy_as_pair(base: Path, root: Path, source: str, target: str, seed: int) -> Path:
    import shutil

    import numpy as np
    import onnx
    from onnx import numpy_helper

    model_dir = root / f"{source}-{target}"
    shutil.copytree(base, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(source_lang=source, target_lang=target, model_name=f"tiny-{source}-{target}")
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    if seed:
        decoder = onnx.load(model_dir / "decoder.onnx")
        [bias] = [i for i in decoder.graph.initializer if i.name == "model.final_logits_bias"]
        values = numpy_helper.to_array(bias).copy()
        noise = np.random.default_rng(seed).normal(0.0, 2.0, values.shape).astype(values.dtype)
        noise[..., 0] = 0.0  # keep eos as likely as before: outputs stay short
        bias.CopyFrom(numpy_helper.from_array(values + noise, bias.name))
        onnx.save(decoder, model_dir / "decoder.onnx")
    return model_dir
