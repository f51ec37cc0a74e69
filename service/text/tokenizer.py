"""Runtime tokenizer for Marian-layout tokenizer directories (no torch, no transformers).

Reads the Hugging Face Marian (OPUS-MT) layout: ``source.spm`` / ``target.spm``
(SentencePiece models that only cut text into pieces), ``vocab.json`` (piece → model id,
the ids the model was trained with; for OPUS-MT they differ from the SentencePiece ids),
optionally ``target_vocab.json`` (models with separate vocabularies) and
``tokenizer_config.json`` (names of the special tokens). It produces the same ids as
``transformers.MarianTokenizer`` on the same files, so our default model and imported
OPUS-MT checkpoints share one code path.

Id convention of the default model (see ``models/training/tokenizer.py``): ``</s>`` = 0,
``<unk>`` = 1, pieces, ``<pad>`` = last id, which is also the decoder start token.

One deliberate difference from ``MarianTokenizer``: text that literally contains
``</s>``/``<unk>``/``<pad>`` is tokenized as text, not turned into the special id, so user
input cannot end the source early. (The service masks such tag-like text with
``service.text.protection.protect`` before it gets here anyway.)
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

SPIECE_UNDERLINE = "\u2581"


class Tokenizer:
    """Text ↔ ids for one Marian-layout model directory.

    ``encode`` uses the source SentencePiece model and ``vocab.json``; ``decode`` uses the
    target vocabulary and the target SentencePiece model, as ``MarianTokenizer`` does.
    """

    def __init__(
        self,
        source_spm: spm.SentencePieceProcessor,
        target_spm: spm.SentencePieceProcessor,
        source_vocab: dict[str, int],
        target_vocab: dict[str, int] | None = None,
        eos_token: str = "</s>",
        unk_token: str = "<unk>",
        pad_token: str = "<pad>",
    ) -> None:
        self._source_spm = source_spm
        self._target_spm = target_spm
        self._source_vocab = source_vocab
        self._target_vocab = target_vocab if target_vocab is not None else source_vocab
        self._piece_of_id = {piece_id: piece for piece, piece_id in self._target_vocab.items()}
        self.eos_id = self._source_vocab[eos_token]
        self.unk_id = self._source_vocab[unk_token]
        self.pad_id = self._source_vocab[pad_token]
        self._special_ids = frozenset({self.eos_id, self.unk_id, self.pad_id})

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``source.spm``, ``target.spm``, ``vocab.json`` (+ optional files) from ``path``."""
        directory = Path(path)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        separate_vocabs = bool(config.get("separate_vocabs", False))
        source_vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        target_vocab = None
        if separate_vocabs:
            target_vocab = json.loads((directory / "target_vocab.json").read_text(encoding="utf-8"))
        return cls(
            source_spm=spm.SentencePieceProcessor(model_file=str(directory / "source.spm")),
            target_spm=spm.SentencePieceProcessor(model_file=str(directory / "target.spm")),
            source_vocab=source_vocab,
            target_vocab=target_vocab,
            eos_token=_token_name(config.get("eos_token"), "</s>"),
            unk_token=_token_name(config.get("unk_token"), "<unk>"),
            pad_token=_token_name(config.get("pad_token"), "<pad>"),
        )

    @property
    def vocab_size(self) -> int:
        """Number of source ids (``len(vocab.json)``), as ``MarianTokenizer.vocab_size``."""
        return len(self._source_vocab)

    def encode_one(self, text: str) -> list[int]:
        """Ids of one text, ``</s>`` appended; a leading ``>>xx<<`` code maps to its id."""
        language_code_ids: list[int] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code = text[: end + 2]
            language_code_ids = [self._source_vocab.get(code, self.unk_id)]
            text = text[end + 2 :]
        pieces = self._source_spm.encode(text, out_type=str)
        ids = [self._source_vocab.get(piece, self.unk_id) for piece in pieces]
        return language_code_ids + ids + [self.eos_id]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text (no padding: batching pads, it knows the pad id)."""
        return [self.encode_one(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of one id sequence; ``</s>``, ``<pad>`` and ``<unk>`` are dropped."""
        pieces = [
            self._piece_of_id[piece_id]
            for piece_id in map(int, ids)
            if piece_id not in self._special_ids and piece_id in self._piece_of_id
        ]
        text = self._target_spm.decode_pieces(pieces)
        return text.replace(SPIECE_UNDERLINE, " ").strip()

    def spells(self, text: str) -> bool:
        """Whether the model can read ``text`` and write it back exactly: every source piece
        has an id on both sides (no unknown piece) and the target model turns those pieces
        back into ``text`` (or its NFC form). False where the tokenizer's normalisation
        changes it (``ℹ️`` → ``i``, ``№`` → ``No``, ``…`` → ``...``, control characters
        removed): service/text/protection.py protects such text from the model."""
        pieces = self._source_spm.encode(text, out_type=str)
        if not all(piece in self._source_vocab and piece in self._target_vocab for piece in pieces):
            return False
        # Only plain spaces are stripped: a form feed the normaliser turned into a space is
        # a loss, not whitespace that came back.
        written = self._target_spm.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip(" ")
        return written in (text.strip(" "), unicodedata.normalize("NFC", text).strip(" "))

    def has_word(self, word: str) -> bool:
        """Whether the source vocabulary has ``word`` as one piece of its own at the start of
        a word (``▁à``): the model has read it as a word, not only inside others."""
        return self._source_vocab.get(SPIECE_UNDERLINE + word, self.unk_id) != self.unk_id

    def unknown_spans(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character spans of ``text`` that encode to the unknown id in
        context (a piece that SentencePiece forms from neighbouring characters may be
        missing from ``vocab.json`` although each character alone is known)."""
        pieces = self._source_spm.encode(text, out_type=str)
        if not any(map(self._is_unknown, pieces)):
            return []  # the common case, without the offsets (a proto costs several times more)
        proto = self._source_spm.encode(text, out_type="proto")
        unknown = [(p.begin, p.end) for p in proto.pieces if self._is_unknown(p.piece)]
        encoded = text.encode("utf-8")  # SentencePiece reports byte offsets

        def char_offset(byte_offset: int) -> int:
            return len(encoded[:byte_offset].decode("utf-8", errors="ignore"))

        return [(char_offset(begin), char_offset(end)) for begin, end in unknown]

    def _is_unknown(self, piece: str) -> bool:
        """A source piece without an id of its own in ``vocab.json``."""
        return self._source_vocab.get(piece, self.unk_id) == self.unk_id


def _token_name(value: object, default: str) -> str:
    """Special tokens in saved configs are either a string or an AddedToken-style dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return default
