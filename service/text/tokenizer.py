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
``service.text.placeholders.protect`` before it gets here anyway.)

NLLB-200 and M2M-100 directories (``sentencepiece.bpe.model``, ``tokenizer_config.json``,
for M2M-100 ``vocab.json``) are read by :class:`NllbTokenizer` and :class:`M2m100Tokenizer`,
the same interface plus language codes: ids as transformers' ``NllbTokenizer`` and
``M2M100Tokenizer`` give them, without transformers.
"""

from __future__ import annotations

import copy
import json
import re
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
        self._last_pieces: tuple[str, list[str]] | None = None

    # A model of one language pair: no language codes, nothing forced.
    languages: tuple[str, ...] = ()

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``source.spm``, ``target.spm``, ``vocab.json`` (+ optional files) from ``path``;
        an NLLB or M2M-100 directory (``sentencepiece.bpe.model``) gives an
        :class:`NllbTokenizer` or :class:`M2m100Tokenizer`."""
        directory = Path(path)
        if cls is Tokenizer and (directory / NLLB_SPM_FILE).exists():
            if (directory / "vocab.json").exists():
                return M2m100Tokenizer.from_dir(directory)
            return NllbTokenizer.from_dir(directory)
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
        pieces = self._source_pieces(text)
        ids = [self._source_vocab.get(piece, self.unk_id) for piece in pieces]
        return language_code_ids + ids + [self.eos_id]

    def _source_pieces(self, text: str) -> list[str]:
        """The source model's pieces of ``text``. The last text's are kept: protection
        (:meth:`unknown_spans`) cuts a sentence into pieces just before it is tokenized, and
        most sentences reach the model as protection saw them. One tuple, replaced whole, so
        a tokenizing worker thread sees a consistent pair."""
        last = self._last_pieces
        if last is not None and last[0] == text:
            return last[1]
        pieces = self._source_spm.encode(text, out_type=str)
        self._last_pieces = (text, pieces)
        return pieces

    def for_source(self, language: str) -> Tokenizer:
        """This tokenizer with sources in ``language`` (one of :attr:`languages`): a model of
        one pair has one source language, so itself."""
        return self

    def target_prefix(self, language: str) -> tuple[int, ...]:
        """Ids the model must generate first to write ``language``: none for one pair."""
        return ()

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
        pieces = self._source_pieces(text)
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


NLLB_SPM_FILE = "sentencepiece.bpe.model"
# fairseq's dictionary puts these first; SentencePiece's own <unk>, <s>, </s> (ids 0-2) map to
# them, and every other piece p has id p + 1.
FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
FAIRSEQ_OFFSET = 1
NLLB_CODE_RE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # deu_Latn, zho_Hant
# NLLB-200's language codes in the order of its dictionary (fairseq's and transformers' list):
# the code at index i has id len(SentencePiece) + 1 + i, and <mask> follows the last.
_NLLB_CODES_TEXT = (
    "ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn amh_Ethi apc_Arab "
    "arb_Arab ars_Arab ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn azb_Arab azj_Latn "
    "bak_Cyrl bam_Latn ban_Latn bel_Cyrl bem_Latn ben_Beng bho_Deva bjn_Arab bjn_Latn bod_Tibt "
    "bos_Latn bug_Latn bul_Cyrl cat_Latn ceb_Latn ces_Latn cjk_Latn ckb_Arab crh_Latn cym_Latn "
    "dan_Latn deu_Latn dik_Latn dyu_Latn dzo_Tibt ell_Grek eng_Latn epo_Latn est_Latn eus_Latn "
    "ewe_Latn fao_Latn pes_Arab fij_Latn fin_Latn fon_Latn fra_Latn fur_Latn fuv_Latn gla_Latn "
    "gle_Latn glg_Latn grn_Latn guj_Gujr hat_Latn hau_Latn heb_Hebr hin_Deva hne_Deva hrv_Latn "
    "hun_Latn hye_Armn ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn jav_Latn jpn_Jpan kab_Latn "
    "kac_Latn kam_Latn kan_Knda kas_Arab kas_Deva kat_Geor knc_Arab knc_Latn kaz_Cyrl kbp_Latn "
    "kea_Latn khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn kon_Latn kor_Hang kmr_Latn lao_Laoo "
    "lvs_Latn lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn lua_Latn lug_Latn "
    "luo_Latn lus_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn mkd_Cyrl plt_Latn mlt_Latn "
    "mni_Beng khk_Cyrl mos_Latn mri_Latn zsm_Latn mya_Mymr nld_Latn nno_Latn nob_Latn npi_Deva "
    "nso_Latn nus_Latn nya_Latn oci_Latn gaz_Latn ory_Orya pag_Latn pan_Guru pap_Latn pol_Latn "
    "por_Latn prs_Arab pbt_Arab quy_Latn ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng "
    "scn_Latn shn_Mymr sin_Sinh slk_Latn slv_Latn smo_Latn sna_Latn snd_Arab som_Latn sot_Latn "
    "spa_Latn als_Latn srd_Latn srp_Cyrl ssw_Latn sun_Latn swe_Latn swh_Latn szl_Latn tam_Taml "
    "tat_Cyrl tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi taq_Latn taq_Tfng tpi_Latn tsn_Latn "
    "tso_Latn tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab ukr_Cyrl umb_Latn urd_Arab "
    "uzn_Latn vec_Latn vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn yue_Hant zho_Hans "
    "zho_Hant zul_Latn"
)
NLLB_LANGUAGE_CODES = tuple(_NLLB_CODES_TEXT.split())
# M2M-100's codes in fairseq's order (transformers' list); the token of ``de`` is ``__de__``.
_M2M100_CODES_TEXT = (
    "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl "
    "gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml "
    "mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl "
    "tn tr uk ur uz vi wo xh yi yo zh zu"
)
M2M100_LANGUAGE_CODES = {
    "m2m100": tuple(_M2M100_CODES_TEXT.split()),
    "wmt21": ("en", "ha", "is", "ja", "cs", "ru", "zh", "de"),
}


class MultilingualTokenizer(Tokenizer):
    """Text ↔ ids for a many-language model (NLLB-200, M2M-100): one SentencePiece model for
    both sides, and language-code tokens after the pieces. A source is
    ``[source code, pieces…, </s>]`` (:meth:`for_source`); the target code is the first id the
    model generates (:meth:`target_prefix`). Subclasses read a layout's files."""

    def __init__(
        self,
        sentence_piece: spm.SentencePieceProcessor,
        vocab: dict[str, int],
        language_ids: dict[str, int],
        bos_token: str = "<s>",
    ) -> None:
        super().__init__(sentence_piece, sentence_piece, vocab)
        self._special_ids = self._special_ids | {vocab[bos_token]}
        self.language_ids = language_ids
        self.languages = tuple(language_ids)
        self._source_prefix: list[int] = []

    @property
    def vocab_size(self) -> int:
        """Pieces, specials and language codes (the model may pad its table further)."""
        return len(self._source_vocab) + len(self.language_ids)

    def _language_id(self, language: str) -> int:
        if language not in self.language_ids:
            raise ValueError(f"the tokenizer has no language code {language!r}")
        return self.language_ids[language]

    def for_source(self, language: str) -> MultilingualTokenizer:
        bound = copy.copy(self)
        bound._source_prefix = [self._language_id(language)]
        return bound

    def target_prefix(self, language: str) -> tuple[int, ...]:
        return (self._language_id(language),)

    def encode_one(self, text: str) -> list[int]:
        """``[source code, pieces…, </s>]`` (no code before :meth:`for_source`)."""
        pieces = self._source_pieces(text)
        ids = [self._source_vocab.get(piece, self.unk_id) for piece in pieces]
        return self._source_prefix + ids + [self.eos_id]


class NllbTokenizer(MultilingualTokenizer):
    """NLLB-200's layout, as transformers' ``NllbTokenizer``: ``sentencepiece.bpe.model``
    with fairseq's id offset, then the language codes (``deu_Latn``).

    The codes and their ids come from ``tokenizer_config.json``: ``added_tokens_decoder``
    (explicit ids, as transformers saves it) where present, else the
    ``additional_special_tokens`` list (or NLLB's own) numbered after the pieces."""

    @classmethod
    def from_dir(cls, path: str | Path) -> NllbTokenizer:
        directory = Path(path)
        sentence_piece = spm.SentencePieceProcessor(model_file=str(directory / NLLB_SPM_FILE))
        vocab = {
            sentence_piece.id_to_piece(piece_id): piece_id + FAIRSEQ_OFFSET
            for piece_id in range(3, sentence_piece.get_piece_size())
        }
        vocab.update(FAIRSEQ_SPECIALS)
        config = _read_config(directory)
        return cls(
            sentence_piece, vocab, nllb_language_ids(config, sentence_piece.get_piece_size())
        )


class M2m100Tokenizer(MultilingualTokenizer):
    """M2M-100's layout, as transformers' ``M2M100Tokenizer``: ``sentencepiece.bpe.model``
    cuts the text, ``vocab.json`` gives the ids, and the language codes (``__de__``, named
    ``de`` here) follow the vocabulary in fairseq's order (``language_codes`` in
    ``tokenizer_config.json``: ``m2m100``, the default, or ``wmt21``)."""

    @classmethod
    def from_dir(cls, path: str | Path) -> M2m100Tokenizer:
        directory = Path(path)
        sentence_piece = spm.SentencePieceProcessor(model_file=str(directory / NLLB_SPM_FILE))
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        config = _read_config(directory)
        family = config.get("language_codes", "m2m100")
        if family not in M2M100_LANGUAGE_CODES:
            raise ValueError(f"{directory}: unknown M2M-100 language_codes {family!r}")
        codes = M2M100_LANGUAGE_CODES[family]
        return cls(sentence_piece, vocab, {code: len(vocab) + i for i, code in enumerate(codes)})


def _read_config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    return config if isinstance(config, dict) else {}


def nllb_language_ids(config: dict, pieces: int) -> dict[str, int]:
    """Language code -> id, from an NLLB ``tokenizer_config.json`` (see NllbTokenizer)."""
    explicit = config.get("added_tokens_decoder")
    if isinstance(explicit, dict) and explicit:
        found = {
            _token_name(token, ""): int(token_id)
            for token_id, token in explicit.items()
            if str(token_id).isdigit()
        }
        codes = {code: token_id for code, token_id in found.items() if NLLB_CODE_RE.match(code)}
        if codes:
            return dict(sorted(codes.items(), key=lambda item: item[1]))
    listed = config.get("additional_special_tokens") or config.get("extra_special_tokens")
    names = [_token_name(token, "") for token in listed] if isinstance(listed, list) else []
    codes_listed = [name for name in names if NLLB_CODE_RE.match(name)]
    ordered = codes_listed or list(NLLB_LANGUAGE_CODES)
    return {code: pieces + FAIRSEQ_OFFSET + index for index, code in enumerate(ordered)}


def _token_name(value: object, default: str) -> str:
    """Special tokens in saved configs are either a string or an AddedToken-style dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return default
