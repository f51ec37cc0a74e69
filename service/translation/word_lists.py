"""The word lists language detection reads (service/translation/detection.py): wordfreq's
frequency lists, shipped in its wheel and read offline, cut to the words frequent enough to
tell languages apart, and how a text's words are scored against them (compounds included).

wordfreq is optional: without it, or for a language it has no list of, the functions here say
so and detection reads the n-grams alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import lru_cache

from service.text.placeholders import PLACEHOLDER_RE

# Words rarer than this (per word of running text) are left out of the lists; an unknown word
# counts as this frequency. 1e-7 keeps 96 k words of English and 173 k of German (35 MiB).
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
# 193 k words for the 22 Latin-script languages beside en/de, under a second to read), an
# unknown word counting as this frequency in every language, served or not.
UNSERVED_MIN_FREQUENCY = 1e-5


@lru_cache(maxsize=2)
def _listed(size: str) -> frozenset[str]:
    """The languages wordfreq has a list of ``size`` for (none without wordfreq)."""
    try:
        import wordfreq
    except ImportError:
        return frozenset()
    return frozenset(wordfreq.available_languages(wordlist=size))


def has_word_list(language: str) -> bool:
    """Whether wordfreq is installed and has a large list for ``language``."""
    return language in _listed("large")


@lru_cache(maxsize=32)
def word_log_frequencies(language: str) -> Mapping[str, float] | None:
    """``word -> log frequency`` of ``language``'s words of at least MIN_FREQUENCY (None when
    wordfreq has no list for it, or is not installed)."""
    if not has_word_list(language):
        return None
    return _read_word_list(language, "large", MIN_FREQUENCY)


def has_common_words(language: str) -> bool:
    """Whether wordfreq is installed and lists ``language``'s common words."""
    return language in _listed("small")


@lru_cache(maxsize=64)
def common_word_log_frequencies(language: str) -> Mapping[str, float] | None:
    """``word -> log frequency`` of ``language``'s words of at least UNSERVED_MIN_FREQUENCY
    (None when wordfreq has no list for it)."""
    if not has_common_words(language):
        return None
    return _read_word_list(language, "small", UNSERVED_MIN_FREQUENCY)


def _read_word_list(language: str, size: str, min_frequency: float) -> Mapping[str, float]:
    import wordfreq

    # The list is stored as buckets of words by frequency, bucket i holding the words of
    # frequency 10^(-i/100): reading the buckets down to min_frequency, one float shared per
    # bucket, takes a fraction of the memory of wordfreq's own dictionary of every word.
    buckets = wordfreq.read_cBpack(str(wordfreq.DATA_PATH / f"{size}_{language}.msgpack.gz"))
    last = round(-100 * math.log10(min_frequency))
    table: dict[str, float] = {}
    for index, bucket in enumerate(buckets[: last + 1]):
        value = -index / 100 * math.log(10)
        for word in bucket:
            table.setdefault(word, value)
    return table


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
