"""Word lists as numpy arrays of word hashes, and a text's words looked up in them.

Language detection reads hundreds of thousands of words (service/translation/word_lists.py).
Held as Python dictionaries of strings to floats they took 133 MB of a server's memory; here
each word is a 64-bit hash in a sorted array, beside the index of its frequency bucket in
wordfreq's lists (``centibels``: the word's frequency is 10^(-centibels/100)), 10 bytes a
word. A word's log frequency is computed from its bucket as the dictionaries computed it, so
scores are the same numbers.

The hash is FNV-1a over the word's code points, then SplitMix64's finaliser: stable across
processes (unlike ``hash``), and computed for a whole list of words at once by numpy. A text's
word shares the hash of a listed word it is not with a chance of about one in 10^13 (lists of a
few hundred thousand words), which is left to chance.

Words longer than ``LONGEST_WORD`` letters are not listed (wordfreq's longest is 33): a
text's longer words are unknown without being hashed, which bounds what one word costs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

LONGEST_WORD = 64
_LOG_10 = math.log(10)
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
_MIX_1, _MIX_2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1
# Fewer words than this are hashed in Python; numpy hashes at most _BATCH at a time (its
# padded copy of the batch stays small).
_FEW_WORDS = 24
_BATCH = 16384


def word_hashes(words: Sequence[str]) -> np.ndarray:
    """The 64-bit hash of each of ``words`` (uint64), in order: numpy over the whole list,
    or Python word by word for a few (numpy's per-call cost is then most of the time)."""
    if len(words) < _FEW_WORDS:
        return np.array([_word_hash(word) for word in words], dtype=np.uint64)
    return np.concatenate(
        [_hash_batch(words[start : start + _BATCH]) for start in range(0, len(words), _BATCH)]
    )


def _word_hash(word: str) -> int:
    hashed = _FNV_OFFSET
    for char in word:
        hashed = ((hashed ^ ord(char)) * _FNV_PRIME) & _MASK
    hashed ^= hashed >> 30
    hashed = (hashed * _MIX_1) & _MASK
    hashed ^= hashed >> 27
    hashed = (hashed * _MIX_2) & _MASK
    return hashed ^ (hashed >> 31)


def _hash_batch(words: Sequence[str]) -> np.ndarray:
    """``_word_hash`` of each word, column by column of their code points. Words hold no NUL
    (they are letter runs): numpy's fixed-width strings pad with NULs, which this skips, so a
    word hashes alike whatever the width of its batch."""
    text = np.array(words, dtype=str)
    width = text.dtype.itemsize // 4
    points = text.view(np.uint32).reshape(len(words), width)
    hashes = np.full(len(words), _FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(_FNV_PRIME)
    for column in points.T:
        code = column.astype(np.uint64)
        hashes = np.where(code != 0, (hashes ^ code) * prime, hashes)
    hashes ^= hashes >> np.uint64(30)
    hashes *= np.uint64(_MIX_1)
    hashes ^= hashes >> np.uint64(27)
    hashes *= np.uint64(_MIX_2)
    hashes ^= hashes >> np.uint64(31)
    return hashes


def log_frequency(centibels: np.ndarray) -> np.ndarray:
    """The natural log of frequencies of 10^(-centibels/100), computed as the dictionaries
    computed each (``-index / 100 * math.log(10)``: the same floats, so the same sums)."""
    return -centibels.astype(np.float64) / 100 * _LOG_10


class WordTable:
    """One language's word list: sorted unique word hashes and each one's frequency bucket."""

    __slots__ = ("_centibels", "_hashes", "_values")

    def __init__(self, hashes: np.ndarray, centibels: np.ndarray) -> None:
        """``hashes`` sorted and unique (uint64), ``centibels`` (uint16) the bucket of each."""
        self._hashes = hashes
        self._centibels = centibels
        top = int(centibels.max()) if len(centibels) else 0
        self._values = log_frequency(np.arange(top + 1))

    @classmethod
    def from_buckets(cls, buckets: Iterable[Sequence[str]]) -> WordTable:
        """The table of wordfreq's buckets (bucket i: the words of frequency 10^(-i/100)); a
        word listed in several keeps its first (most frequent) bucket."""
        words: list[str] = []
        sizes: list[int] = []
        for bucket in buckets:
            kept = [word for word in bucket if len(word) <= LONGEST_WORD]
            words += kept
            sizes.append(len(kept))
        hashes = word_hashes(words)
        centibels = np.repeat(np.arange(len(sizes), dtype=np.uint16), sizes)
        del words
        order = np.lexsort((centibels, hashes))  # by hash, then most frequent first
        hashes, centibels = hashes[order], centibels[order]
        first = np.ones(len(hashes), dtype=bool)
        first[1:] = hashes[1:] != hashes[:-1]
        return cls(hashes[first], centibels[first])

    def __len__(self) -> int:
        return len(self._hashes)

    @property
    def nbytes(self) -> int:
        return self._hashes.nbytes + self._centibels.nbytes + self._values.nbytes

    @property
    def hashes(self) -> np.ndarray:
        return self._hashes

    @property
    def centibels(self) -> np.ndarray:
        return self._centibels

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """The log frequency of each hashed word (float64), NaN where it is not listed."""
        if not len(self._hashes) or not len(hashes):
            return np.full(len(hashes), np.nan)
        at = np.minimum(np.searchsorted(self._hashes, hashes), len(self._hashes) - 1)
        found = self._hashes[at] == hashes
        return np.where(found, self._values[self._centibels[at]], np.nan)

    def get(self, word: str, default: float | None = None) -> float | None:
        """One word's log frequency (``default`` when it is not listed)."""
        if len(word) > LONGEST_WORD:
            return default
        [value] = self.lookup(word_hashes([word])).tolist()
        return default if math.isnan(value) else value


class WordTables:
    """Several languages' word lists merged into one sorted array, so that a text's words are
    looked up in all of them at once (one ``np.searchsorted`` pair, not one per language)."""

    __slots__ = ("_centibels", "_hashes", "_languages", "_values", "count")

    def __init__(self, tables: Sequence[WordTable]) -> None:
        self.count = len(tables)
        hashes = np.concatenate([table.hashes for table in tables] or [np.zeros(0, np.uint64)])
        order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[order]
        self._centibels = np.concatenate(
            [table.centibels for table in tables] or [np.zeros(0, np.uint16)]
        )[order]
        self._languages = np.concatenate(
            [np.full(len(table), index, dtype=np.uint16) for index, table in enumerate(tables)]
            or [np.zeros(0, np.uint16)]
        )[order]
        top = int(self._centibels.max()) if len(self._centibels) else 0
        self._values = log_frequency(np.arange(top + 1))

    @property
    def nbytes(self) -> int:
        arrays = (self._hashes, self._centibels, self._languages, self._values)
        return sum(array.nbytes for array in arrays)

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Each table's log frequency of each hashed word: ``(tables, words)`` float64, NaN
        where a table does not list the word."""
        found = np.full((self.count, len(hashes)), np.nan)
        left = np.searchsorted(self._hashes, hashes, side="left")
        counts = np.searchsorted(self._hashes, hashes, side="right") - left
        total = int(counts.sum())
        if total:
            # the entries of each word (a run of equal hashes: one per table listing it)
            word = np.repeat(np.arange(len(hashes)), counts)
            entry = np.repeat(left - (np.cumsum(counts) - counts), counts) + np.arange(total)
            found[self._languages[entry], word] = self._values[self._centibels[entry]]
        return found
