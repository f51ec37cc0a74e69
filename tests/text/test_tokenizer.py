"""Runtime tokenizer: same ids as transformers.MarianTokenizer on the same files."""

import json
import random
from pathlib import Path

import pytest
import sentencepiece as spm

from models.training.corpus import Pair
from models.training.tokenizer import (
    tokenizer_statistics,
    train_sentencepiece,
    write_marian_layout,
)
from service.text.placeholders import PLACEHOLDER_SYMBOLS, protect, restore
from service.text.tokenizer import Tokenizer

VOCAB_SIZE = 160
WORDS = [
    "file",
    "folder",
    "open",
    "close",
    "save",
    "delete",
    "user",
    "account",
    "password",
    "settings",
    "the",
    "a",
    "of",
    "to",
    "is",
    "new",
    "old",
    "name",
    "value",
    "could",
    "not",
    "read",
    "write",
    "permission",
    "denied",
    "Datei",
    "Ordner",
    "öffnen",
    "schließen",
    "speichern",
    "löschen",
    "Benutzer",
    "Konto",
    "Passwort",
    "Einstellungen",
    "konnte",
    "nicht",
    "lesen",
    "schreiben",
    "Zugriff",
    "verweigert",
    "neu",
    "alt",
    "Wert",
]


def _sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 9))]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, len(words)), rng.choice(PLACEHOLDER_SYMBOLS[:4]))
        sentences.append(" ".join(words).capitalize() + rng.choice([".", "?", "", ":"]))
    return sentences


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    processor = train_sentencepiece(_sentences(600, seed=0), vocab_size=VOCAB_SIZE, num_threads=1)
    write_marian_layout(processor, directory)
    return directory


@pytest.fixture
def hf_marian(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")

    def load(directory: Path):
        return transformers.MarianTokenizer(
            source_spm=str(directory / "source.spm"),
            target_spm=str(directory / "target.spm"),
            vocab=str(directory / "vocab.json"),
        )

    return load


TEXTS = _sentences(200, seed=1) + [
    "",
    "  spaces   inside  ",
    "Unseen characters: Ωμέγα 🙂",
    "｟0｠ Datei ｟1｠öffnen",
    ">>de<< open the file",
]


def test_ids_match_transformers_marian_tokenizer(tokenizer_dir: Path, hf_marian) -> None:
    reference = hf_marian(tokenizer_dir)
    ours = Tokenizer.from_dir(tokenizer_dir)
    assert ours.encode(TEXTS) == reference(TEXTS)["input_ids"]
    assert ours.vocab_size == reference.vocab_size
    assert (ours.eos_id, ours.unk_id, ours.pad_id) == (
        reference.eos_token_id,
        reference.unk_token_id,
        reference.pad_token_id,
    )


def test_decode_matches_transformers_marian_tokenizer(tokenizer_dir: Path, hf_marian) -> None:
    reference = hf_marian(tokenizer_dir)
    ours = Tokenizer.from_dir(tokenizer_dir)
    for ids in ours.encode(TEXTS):
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_ids_match_with_an_opus_style_vocab_that_differs_from_spm_ids(
    tokenizer_dir: Path, hf_marian, tmp_path: Path
) -> None:
    """OPUS-MT vocab.json ids are not the SentencePiece ids: the mapping must be used."""
    for name in ("source.spm", "target.spm", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tokenizer_dir / name).read_bytes())
    pieces = list(json.loads((tokenizer_dir / "vocab.json").read_text()))
    ordinary = [p for p in pieces if p not in ("</s>", "<unk>", "<pad>")]
    random.Random(3).shuffle(ordinary)
    ordinary = ordinary[: len(ordinary) - 20]  # some pieces missing → unk, as in OPUS-MT
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(ordinary)}}
    vocab["<pad>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))

    reference = hf_marian(tmp_path)
    ours = Tokenizer.from_dir(tmp_path)
    assert ours.encode(TEXTS) == reference(TEXTS)["input_ids"]
    for ids in ours.encode(TEXTS[:50]):
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_special_ids_follow_the_marian_convention(tokenizer_dir: Path) -> None:
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    assert tokenizer.vocab_size == VOCAB_SIZE
    assert (tokenizer.eos_id, tokenizer.unk_id, tokenizer.pad_id) == (0, 1, VOCAB_SIZE - 1)
    assert all(ids[-1] == tokenizer.eos_id for ids in tokenizer.encode(TEXTS))


def test_decode_inverts_encode_and_drops_special_ids(tokenizer_dir: Path) -> None:
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    for text in _sentences(50, seed=2):
        ids = tokenizer.encode([text])[0]
        assert tokenizer.decode(ids) == text
        assert tokenizer.decode([tokenizer.pad_id, *ids, tokenizer.pad_id]) == text


def test_unseen_characters_become_unk(tokenizer_dir: Path) -> None:
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    assert tokenizer.unk_id in tokenizer.encode(["Ωμέγα"])[0]


def test_placeholder_symbols_are_single_tokens_and_survive_decoding(tokenizer_dir: Path) -> None:
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text())
    masked, originals = protect("Delete %(count)d files in <b>{folder}</b>?")
    ids = tokenizer.encode([masked])[0]
    for symbol in PLACEHOLDER_SYMBOLS[: len(originals)]:
        assert vocab[symbol] in ids
    assert restore(tokenizer.decode(ids), originals) == "Delete %(count)d files in <b>{folder}</b>?"


def test_statistics_of_an_empty_split_are_empty(tokenizer_dir: Path) -> None:
    """A corpus built without the catalogs (``--parts general``) has an empty ``valid``."""
    processor = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "source.spm"))
    assert tokenizer_statistics(processor, []) == {}
    pair = Pair("Open the file.", "Datei öffnen.", "debian:x", "GPL")
    assert tokenizer_statistics(processor, [pair])["sentences"] == 1


class _CountingPieces:
    """A SentencePiece processor that counts the texts it cuts into pieces."""

    def __init__(self, processor) -> None:
        self._processor = processor
        self.cut: list[str] = []

    def encode(self, text, *args, **kwargs):
        self.cut.append(text)
        return self._processor.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._processor, name)


def test_a_sentence_checked_for_unknown_pieces_is_not_cut_again_to_tokenize(
    tokenizer_dir: Path,
) -> None:
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    expected = Tokenizer.from_dir(tokenizer_dir)
    counting = _CountingPieces(tokenizer._source_spm)
    tokenizer._source_spm = counting  # type: ignore[assignment]
    for text in ("Datei öffnen neu", "Zugriff verweigert", "Datei öffnen neu"):
        assert tokenizer.unknown_spans(text) == expected.unknown_spans(text)
        assert tokenizer.encode_one(text) == expected.encode_one(text)
    assert counting.cut == ["Datei öffnen neu", "Zugriff verweigert", "Datei öffnen neu"]
