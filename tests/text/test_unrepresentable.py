"""What the model cannot spell is found (service/text/unspellable.py), masked, then restored
verbatim (service/text/protection.py).

Against real tokenizers: the shipped default model's (8,000 pieces) and tiny ones trained here,
with and without the ``｟k｠`` symbols.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.text.placeholders import MAX_PLACEHOLDERS, PLACEHOLDER_SYMBOLS, restore
from service.text.protection import RunProtector, restore_every_run, usable_symbols
from service.text.segmenter import join_translations, sentence_spans
from service.text.tokenizer import Tokenizer
from service.text.unspellable import UnspellableRuns
from tests.service_fixtures import train_tiny_tokenizer

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "default"


@pytest.fixture(scope="module")
def default() -> RunProtector:
    return RunProtector(Tokenizer.from_dir(DEFAULT_MODEL))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    train_tiny_tokenizer(directory)
    return directory


def runs_of(protector: RunProtector, text: str) -> list[str]:
    return [text[start:end] for start, end in protector.unspellable.runs(text)]


@pytest.mark.parametrize(
    "text, masked, originals",
    [
        ("smile 😀 ok", "smile ｟0｠ ok", ["😀"]),
        ("Open the file from 東京", "Open the file from ｟0｠", ["東京"]),
        ("Item № 5", "Item ｟0｠ 5", ["№"]),
        ("Toggle Sort Order ℹ️", "Toggle Sort Order ｟0｠", ["ℹ️"]),
        ("Loading…", "Loading｟0｠", ["…"]),
    ],
)
def test_what_the_default_vocabulary_cannot_spell_is_masked(default, text, masked, originals):
    assert default.protect(text) == (masked, originals)


def test_what_the_model_spells_is_left_to_it(default):
    text = 'Save the file "report" as über-größe (2 MB, 50% done)? Yes.'
    assert default.protect(text) == (text, [])


@pytest.mark.parametrize("emoji", ["👍🏽", "👨‍👩‍👧", "🇩🇪", "✔️", "🏳️‍🌈"])
def test_an_emoji_sequence_is_one_run(default, emoji):
    assert runs_of(default, f"Like {emoji} this") == [emoji]


def test_a_name_is_one_run_and_a_word_is_protected_whole(default):
    assert runs_of(default, "Send Дмитрий Иванов a file") == ["Дмитрий Иванов"]
    assert runs_of(default, "Zoë saved the file") == ["Zoë"]  # not "Zo" + protected "ë"


def test_composed_and_decomposed_letters_the_model_knows_are_left_to_it(default):
    assert default.protect("Datei für Jürgen") == ("Datei für Jürgen", [])
    decomposed = "Datei fu\u0308r"
    assert default.protect(decomposed) == (decomposed, [])  # the tokenizer composes it
    # A combining mark the vocabulary lacks stays with its letter and its word.
    assert runs_of(default, "the q\u0301uery") == ["q\u0301uery"]


def test_control_characters_are_protected_whitespace_is_not(default):
    assert runs_of(default, "Save\x00 file") == ["\x00"]
    assert runs_of(default, "\x1b[1mBold") == ["\x1b"]
    assert runs_of(default, "Page\x0cbreak") == ["\x0c"]
    assert runs_of(default, "Name:\tvalue  and\u00a0more") == []


def test_placeholders_and_runs_share_one_numbering(default):
    masked, originals = default.protect("Send %s to 東京, then %s 😀")
    assert masked == "Send ｟0｠ to ｟1｠, then ｟0｠ ｟2｠"
    assert originals == ["%s", "東京", "😀"]


def test_more_distinct_runs_than_symbols_are_merged_never_dropped(default):
    emoji = [chr(0x1F600 + i) for i in range(MAX_PLACEHOLDERS + 8)]
    text = " ".join(f"file {e}" for e in emoji)
    masked, originals = default.protect(text)
    assert len(originals) <= default.symbols == MAX_PLACEHOLDERS
    assert set(PLACEHOLDER_SYMBOLS[: len(originals)]) <= set(masked.split())
    assert restore(masked, originals) == text  # every character still there, in place
    assert "file" in masked  # most of the words still reach the model


def test_a_symbol_the_decoder_did_not_emit_is_appended_not_lost():
    masked_source = "smile ｟0｠ and ｟1｠ ｟1｠"
    assert restore_every_run("lächeln ｟1｠", ["😀", "✔"], masked_source) == "lächeln ✔ 😀 ✔"
    assert restore_every_run("", ["😀"], "｟0｠ ok") == "😀"


def test_pieces_unknown_only_in_context_are_protected(tiny_dir, tmp_path):
    """OPUS-MT's vocab.json can lack a piece SentencePiece forms from known characters."""
    vocab = json.loads((tiny_dir / "vocab.json").read_text())
    merged = next(p for p in ("▁password", "▁account", "▁login") if p in vocab)
    del vocab[merged]
    for name in ("source.spm", "target.spm", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    (tmp_path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    protector = RunProtector(Tokenizer.from_dir(tmp_path))
    word = merged.lstrip("▁")
    assert protector.tokenizer.spells(word[0])  # each letter alone is known
    assert runs_of(protector, f"open {word} now") == [word]


def test_a_model_without_symbols_translates_around_the_runs(tmp_path):
    train_tiny_tokenizer(tmp_path, placeholder_symbols=False)
    protector = RunProtector(Tokenizer.from_dir(tmp_path))
    assert protector.symbols == usable_symbols(protector.tokenizer) == 0
    text = "Open 😀 the file. Save 東京"
    spans = protector.cut_around_runs(text, sentence_spans(text))
    assert [text[start:end] for start, end in spans] == ["Open", "the file.", "Save"]
    translated = join_translations(text, spans, ["Öffnen", "die Datei.", "Speichern"])
    assert translated == "Öffnen 😀 die Datei. Speichern 東京"


def test_a_model_with_symbols_keeps_its_sentences_whole(default):
    text = "Open 😀 the file."
    spans = sentence_spans(text)
    assert default.cut_around_runs(text, spans) == spans


def proto_unknown_spans(tokenizer: Tokenizer, text: str) -> list[tuple[int, int]]:
    """Reference: every piece of SentencePiece's proto whose vocab.json id is unknown, as
    character spans (the implementation skips the proto when no piece is unknown)."""
    proto = tokenizer._source_spm.encode(text, out_type="proto")
    encoded = text.encode("utf-8")
    return [
        (len(encoded[: p.begin].decode("utf-8", "ignore")), len(encoded[: p.end].decode()))
        for p in proto.pieces
        if tokenizer._source_vocab.get(p.piece, tokenizer.unk_id) == tokenizer.unk_id
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Save the document before closing the window.",
        "smile 😀 ok",
        "Open the file from 東京 and 서울",
        "Item № 5… done",
        "<unk> is a piece too",
        "",
    ],
)
def test_unknown_spans_match_the_proto_reference(default, text):
    assert default.tokenizer.unknown_spans(text) == proto_unknown_spans(default.tokenizer, text)


# --- symbols, pictographs and lone letters, whether or not the vocabulary spells them -----


def test_symbols_and_emoji_are_masked_even_where_the_vocabulary_spells_them(default):
    # The default vocabulary has pieces for these: the tokenizer alone would leave them to the
    # model, which drops them at will ("Do not ask © again" lost its ©).
    assert all(default.tokenizer.spells(char) for char in "©→+|")
    masked, originals = default.protect("Do not ask © again ™ → € 😀 for this session")
    assert masked == "Do not ask ｟0｠ again ｟1｠ for this session"
    assert originals == ["©", "™ → € 😀"]
    assert default.protect("Press Ctrl+S or | to save") == (
        "Press Ctrl｟0｠S or ｟1｠ to save",
        ["+", "|"],
    )


def test_punctuation_stays_the_models(default):
    text = "He said \u201cSave\u201d \u2013 or \u201eclose\u201c \u2014 (now), [ok]; -1/2: yes! #3 & @you"
    assert all(default.tokenizer.spells(char) for char in "\u201c\u2013\u201e\u2014")
    assert default.protect(text) == (text, [])


@pytest.mark.parametrize(
    "text, run",
    [
        ("Pay $5.99 now", "$5.99"),
        ("It costs 5 € a month", "5 €"),
        ("It costs € 1,200.50 a year", "€ 1,200.50"),
        ("The € sign", "€"),
    ],
)
def test_a_currency_sign_takes_the_number_it_touches(default, text, run):
    assert runs_of(default, text) == [run]


@pytest.mark.parametrize(
    "text, runs",
    [
        ("Do not ask ß again", ["ß"]),  # a letter of another language, alone
        ("Press Ж to continue", ["Ж"]),  # a letter of another script, alone
        ("the α version", ["α"]),
        ("Размер 5 x 3", ["Размер", "x"]),  # Latin x among Cyrillic (and Cyrillic unspelled)
        ("Send Дмитрий Иванов a file", ["Дмитрий Иванов"]),  # "a" is English here
        ("Save a file, I said", []),
        ("Datei für Jürgen", []),  # letters inside words stay the model's
    ],
)
def test_lone_letters_foreign_to_the_sentence_are_protected(default, text, runs):
    assert runs_of(default, text) == runs


def test_a_lone_letter_the_vocabulary_has_as_a_word_stays_the_models(tiny_dir, tmp_path):
    vocab = json.loads((tiny_dir / "vocab.json").read_text())
    protector = RunProtector(Tokenizer.from_dir(tiny_dir))
    assert "▁ß" not in vocab and runs_of(protector, "open ß file") == ["ß"]
    vocab["▁ß"] = len(vocab)  # as a French vocabulary has "▁à"
    for name in ("source.spm", "target.spm", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    (tmp_path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    assert UnspellableRuns(Tokenizer.from_dir(tmp_path)).lone_letters("open ß file") == []
