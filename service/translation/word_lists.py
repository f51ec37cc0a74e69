"""The word lists language detection reads (service/translation/detection.py): wordfreq's
frequency lists, shipped in its wheel and read offline, cut to the words frequent enough to
tell languages apart, and how a text's words are scored against them (compounds included).

The lists are held as compact tables of word hashes (service/translation/word_table.py), read
straight from wordfreq's data files: only the buckets down to the cut are decoded, and
wordfreq itself (with its tokenizers' imports) is not imported.

wordfreq is optional: without it, or for a language it has no list of, the functions here say
so and detection reads the n-grams alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from service.text.placeholders import PLACEHOLDER_RE
from service.translation.word_table import LONGEST_WORD, WordTable, WordTables, word_hashes

# Words rarer than this (per word of running text) are left out of the lists; an unknown word
# counts as this frequency. 1e-7 keeps 96 k words of English and 173 k of German (2.7 MB as
# tables; 35 MiB as Python dictionaries).
MIN_FREQUENCY = 1e-7
_LOG_FLOOR = math.log(MIN_FREQUENCY)
_WORD_RE = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")
# A word missing from a language's list may be a compound of two words in it ("Produkt" +
# "information", "Installation" + s + "dokumentation"): it counts as its rarer part, where
# both parts have at least COMPOUND_MIN_PART letters (chosen on the pretalx half of the
# held-out strings: 4 let English words split into German pieces, "tot" + "als"). German
# joins its compounds' parts with these linking letters; other languages with none.
COMPOUND_MIN_PART = 5
COMPOUND_LINKS: Mapping[str, tuple[str, ...]] = {"de": ("", "s", "es", "n", "en", "e")}
# The words of the languages the service does not translate from (those of the served scripts
# that wordfreq lists): their words of at least this frequency (wordfreq's small lists, cut:
# 193 k words for the 22 Latin-script languages beside en/de), an unknown word counting as
# this frequency in every language, served or not.
UNSERVED_MIN_FREQUENCY = 1e-5


@lru_cache(maxsize=1)
def _data_dir() -> Path | None:
    """wordfreq's data folder, found without importing wordfreq (None when it or msgpack,
    which its files need, is not installed)."""
    spec = find_spec("wordfreq")
    if spec is None or not spec.submodule_search_locations or find_spec("msgpack") is None:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@lru_cache(maxsize=2)
def _listed(size: str) -> frozenset[str]:
    """The languages wordfreq has a list of ``size`` for (none without wordfreq)."""
    folder = _data_dir()
    if folder is None:
        return frozenset()
    # wordfreq's available_languages(): files named <size>_<language>.msgpack.gz
    return frozenset(
        path.name.split(".")[0].split("_", 1)[1] for path in folder.glob(f"{size}_*.msgpack.gz")
    )


def has_word_list(language: str) -> bool:
    """Whether wordfreq is installed and has a large list for ``language``."""
    return language in _listed("large")


@lru_cache(maxsize=32)
def word_log_frequencies(language: str) -> WordTable | None:
    """The log frequencies of ``language``'s words of at least MIN_FREQUENCY (None when
    wordfreq has no list for it, or is not installed)."""
    if not has_word_list(language):
        return None
    return _read_word_list(language, "large", MIN_FREQUENCY)


def has_common_words(language: str) -> bool:
    """Whether wordfreq is installed and lists ``language``'s common words."""
    return language in _listed("small")


@lru_cache(maxsize=64)
def common_word_log_frequencies(language: str) -> WordTable | None:
    """The log frequencies of ``language``'s words of at least UNSERVED_MIN_FREQUENCY (None
    when wordfreq has no list for it)."""
    if not has_common_words(language):
        return None
    return _read_word_list(language, "small", UNSERVED_MIN_FREQUENCY)


def _read_word_list(language: str, size: str, min_frequency: float) -> WordTable:
    folder = _data_dir()
    assert folder is not None  # has_word_list / has_common_words said it is there
    last = round(-100 * math.log10(min_frequency))
    return WordTable.from_buckets(_buckets(folder / f"{size}_{language}.msgpack.gz", last + 1))


def _buckets(path: Path, count: int) -> Iterator[list[str]]:
    """The first ``count`` buckets of a wordfreq list (wordfreq's ``read_cBpack``: a header,
    then bucket i holding the words of frequency 10^(-i/100)), decoded one at a time: the
    rarer words after them, most of the file, are never turned into strings."""
    import gzip

    import msgpack  # type: ignore[import-untyped]  # wordfreq's dependency, no stubs

    with gzip.open(path, "rb") as infile:
        unpacker = msgpack.Unpacker(infile, raw=False)
        length = unpacker.read_array_header()
        header = unpacker.unpack()
        if (
            not isinstance(header, dict)
            or header.get("format") != "cB"
            or header.get("version") != 1
        ):
            raise ValueError(f"{path}: not a wordfreq cBpack list (header {header!r})")
        for _ in range(min(count, length - 1)):
            yield unpacker.unpack()


def words_of(text: str) -> list[str]:
    """The words the word model reads: letter runs (with an inner apostrophe) outside
    placeholders, lower-cased."""
    return [word.lower() for word in _WORD_RE.findall(PLACEHOLDER_RE.sub(" ", text))]


def word_score(table: Mapping[str, float], word: str, links: tuple[str, ...]) -> float:
    """The log frequency of ``word`` in ``table``; for a word missing from it, that of its
    rarer part where it splits into two listed words (with one of ``links`` between them);
    else the floor every unknown word gets."""
    known = table.get(word)
    if known is not None:
        return known
    best = _LOG_FLOOR
    for cut in range(COMPOUND_MIN_PART, len(word) - COMPOUND_MIN_PART + 1):
        head = table.get(word[:cut])
        if head is None or head <= best:
            continue
        for link in links:
            if not word.startswith(link, cut):
                continue
            tail = table.get(word[cut + len(link) :])
            if tail is not None and len(word) - cut - len(link) >= COMPOUND_MIN_PART:
                best = max(best, min(head, tail))
    return best


class TextWords:
    """A text's words looked up in languages' merged tables: hashed once, looked up at once."""

    __slots__ = ("_hashable", "_hashed", "_listed", "_scores", "_tables", "hashes", "words")

    def __init__(
        self, words: Sequence[str], tables: WordTables, hashed: dict[str, int] | None = None
    ) -> None:
        """``hashed``: the hashes of strings already hashed (another ``TextWords`` of the same
        text shares them), filled in here."""
        self.words = list(words)
        self._tables = tables
        self._hashed = {} if hashed is None else hashed
        # a word longer than any listed one is unknown without its hash (word_table.py)
        self._hashable = np.array([len(word) <= LONGEST_WORD for word in self.words], dtype=bool)
        self.hashes = self._hashes(
            [word if len(word) <= LONGEST_WORD else "" for word in self.words]
        )
        self._listed: np.ndarray | None = None
        self._scores: tuple[Sequence[tuple[str, ...]], list[list[float]]] | None = None

    def _hashes(self, strings: list[str]) -> np.ndarray:
        fresh = [string for string in dict.fromkeys(strings) if string not in self._hashed]
        self._hashed.update(zip(fresh, word_hashes(fresh).tolist(), strict=True))
        return np.array([self._hashed[string] for string in strings], dtype=np.uint64)

    def listed(self) -> np.ndarray:
        """Each table's log frequency of each word: ``(tables, words)``, NaN where a table
        does not list the word."""
        if self._listed is None:
            self._listed = np.where(self._hashable, self._tables.lookup(self.hashes), np.nan)
        return self._listed

    def scores(self, links: Sequence[tuple[str, ...]]) -> list[list[float]]:
        """For each of the first ``len(links)`` tables (whose language joins compounds with
        ``links[i]``), each word's ``word_score``: its log frequency, or that of the rarer
        part of a listed compound, or the floor."""
        if self._scores is not None and self._scores[0] == links:
            return self._scores[1]
        found = [
            {word: value for word, value in zip(self.words, row, strict=True) if value == value}
            for row in self.listed()[: len(links)].tolist()  # value == value: not NaN
        ]
        pieces = sorted(
            {
                piece
                for listed in found
                for word in self.words
                if word not in listed
                for piece in _compound_pieces(word)
            }
        )
        if pieces:
            rows = self._tables.lookup(self._hashes(pieces))[: len(links)].tolist()
            for listed, row in zip(found, rows, strict=True):
                listed.update(
                    (piece, value)
                    for piece, value in zip(pieces, row, strict=True)
                    if value == value
                )
        scores = [
            [word_score(listed, word, table_links) for word in self.words]
            for listed, table_links in zip(found, links, strict=True)
        ]
        self._scores = (links, scores)
        return scores


def _compound_pieces(word: str) -> list[str]:
    """Every head and tail ``word_score`` may find listed in splitting ``word``: the prefixes
    and suffixes of at least COMPOUND_MIN_PART letters that leave as many to the other side
    (and no longer than a listed word can be)."""
    heads = range(COMPOUND_MIN_PART, min(len(word) - COMPOUND_MIN_PART, LONGEST_WORD) + 1)
    tails = range(
        max(COMPOUND_MIN_PART, len(word) - LONGEST_WORD), len(word) - COMPOUND_MIN_PART + 1
    )
    return [word[:cut] for cut in heads] + [word[start:] for start in tails]
