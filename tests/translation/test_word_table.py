"""The word lists as tables of word hashes (service/translation/word_table.py) score every word
as the dictionaries they replace did: the same log frequencies, the same compound splits, so
the same detections.

The reference here is the dictionary reading the service held before: wordfreq's own reader,
every bucket down to the cut, ``word -> log frequency`` with a word's first bucket kept.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from service.text.placeholders import PLACEHOLDER_RE
from service.translation.detection import (
    NGRAM_WEIGHT,
    TOP_CANDIDATES,
    UNSERVED_WORDS_CONFIDENCE,
    Detection,
    LanguageDetector,
    has_letters,
    in_scripts,
    ngram_scores,
    sample,
    softmax,
)
from service.translation.word_lists import (
    _LOG_FLOOR,
    COMPOUND_LINKS,
    MIN_FREQUENCY,
    UNSERVED_MIN_FREQUENCY,
    TextWords,
    common_word_log_frequencies,
    word_log_frequencies,
    word_score,
    words_of,
)
from service.translation.word_table import LONGEST_WORD, WordTable, WordTables, word_hashes

HELDOUT = Path(__file__).resolve().parents[2] / "bench" / "heldout"


def reference_table(language: str, size: str, min_frequency: float) -> dict[str, float]:
    wordfreq = pytest.importorskip("wordfreq")
    buckets = wordfreq.read_cBpack(str(wordfreq.DATA_PATH / f"{size}_{language}.msgpack.gz"))
    last = round(-100 * math.log10(min_frequency))
    table: dict[str, float] = {}
    for index, bucket in enumerate(buckets[: last + 1]):
        value = -index / 100 * math.log(10)
        for word in bucket:
            table.setdefault(word, value)
    return table


def heldout_texts() -> dict[str, list[str]]:
    """The held-out strings by language: en/de (short and long) and the unserved ones."""
    texts: dict[str, list[str]] = {}
    en_de = json.loads((HELDOUT / "ui_strings_en_de.json").read_text())["strings"]
    for project in en_de.values():
        for language, lengths in project.items():
            texts.setdefault(language, []).extend(t for kind in lengths.values() for t in kind)
    unserved = json.loads((HELDOUT / "ui_strings_unserved.json").read_text())["strings"]
    return texts | unserved


def heldout_words() -> list[str]:
    """Every word of the held-out strings, in order of first use, and the compounds the
    detection tests name."""
    texts = [text for texts in heldout_texts().values() for text in texts]
    texts += ["Produktinformation Installationsdokumentation Konfigurationsdokumentation"]
    return list(dict.fromkeys(word for text in texts for word in words_of(text)))


def listed(words: TextWords) -> list[float | None]:
    """The first table's log frequency of each word, None where it is not listed."""
    return [None if math.isnan(value) else value for value in words.listed()[0].tolist()]


@pytest.mark.parametrize("language", ["en", "de"])
def test_a_served_languages_table_scores_every_heldout_word_as_its_dictionary(language):
    reference = reference_table(language, "large", MIN_FREQUENCY)
    table = word_log_frequencies(language)
    assert table is not None
    assert len(table) == len(reference)
    tables = WordTables([table])
    # every listed word with its own value
    assert listed(TextWords(list(reference), tables)) == list(reference.values())
    words = heldout_words()
    links = COMPOUND_LINKS.get(language, ("",))
    expected = [word_score(reference, word, links) for word in words]
    assert TextWords(words, tables).scores([links]) == [expected]
    # the held-out set exercises the compound rule, not only listed words and the floor
    assert any(
        score != _LOG_FLOOR and word not in reference
        for word, score in zip(words, expected, strict=True)
    )


def test_the_unserved_languages_tables_list_every_heldout_word_as_their_dictionaries():
    languages = LanguageDetector(["en", "de"])._others
    assert len(languages) > 10
    tables = [common_word_log_frequencies(language) for language in languages]
    # merged, as the detector reads them
    words = TextWords(heldout_words(), WordTables([table for table in tables if table]))
    merged = words.listed()
    for language, table, row in zip(languages, tables, merged.tolist(), strict=True):
        reference = reference_table(language, "small", UNSERVED_MIN_FREQUENCY)
        assert table is not None and len(table) == len(reference), language
        expected = [reference.get(word) for word in words.words]
        assert [None if math.isnan(value) else value for value in row] == expected, language


def test_a_word_in_two_buckets_keeps_its_more_frequent_one():
    table = WordTable.from_buckets([[], ["the"], [], ["cat", "the"], ["dog"]])
    assert len(table) == 3
    assert table.get("the") == -1 / 100 * math.log(10)
    assert table.get("cat") == -3 / 100 * math.log(10)
    assert table.get("mouse") is None
    assert table.get("mouse", -9.0) == -9.0


def test_a_word_hashes_alike_alone_and_in_a_batch_of_any_width():
    # a few words are hashed in Python, many by numpy, which pads a batch's strings to its
    # longest with NULs (skipped by the hash)
    words = ["haus", "hau", "hausa", "shau", "sauh", "donaudampfschifffahrt", "größe", "a\ud800b"]
    alone = [int(word_hashes([word])[0]) for word in words]
    assert word_hashes(words * 10).tolist() == alone * 10
    assert word_hashes(words[:3] * 10).tolist() == alone[:3] * 10  # another width
    assert len(set(alone)) == len(words)
    assert word_hashes([]).dtype == np.uint64


def test_the_merged_tables_find_what_each_table_finds():
    tables = [
        WordTable.from_buckets([["the"], ["cat"]]),
        WordTable.from_buckets([[], ["der"], ["cat", "the"]]),
        WordTable.from_buckets([]),
    ]
    words = ["the", "cat", "der", "dog", "x" * 100]
    merged = TextWords(words, WordTables(tables)).listed()
    assert merged.shape == (3, 5)
    for row, table in zip(merged.tolist(), tables, strict=True):
        alone = listed(TextWords(words, WordTables([table])))
        assert [None if math.isnan(v) else v for v in row] == alone


def test_a_word_longer_than_any_listed_is_unknown():
    long = "a" * (LONGEST_WORD + 1)
    table = WordTable.from_buckets([[long, "b"]])
    assert len(table) == 1
    assert listed(TextWords([long, "b"], WordTables([table]))) == [None, 0.0]


def test_a_lone_surrogate_is_hashed_not_refused():
    # JSON may carry one ("\\ud800"); it is no listed word, and must not raise.
    table = WordTable.from_buckets([["ab"]])
    assert listed(TextWords(["a\ud800b"], WordTables([table]))) == [None]


def test_the_tables_take_a_small_fraction_of_the_dictionaries_memory():
    tables = [word_log_frequencies("en"), word_log_frequencies("de")]
    assert all(tables)
    # 10 bytes a word (the dictionaries took over 100 bytes a word)
    assert sum(table.nbytes for table in tables if table) < 12 * sum(map(len, tables))


def reference_detect(detector: LanguageDetector, text: str, served, others) -> list[Detection]:
    """``detector.detect`` as it read the dictionaries ``served`` and ``others`` (one per
    served and per unserved language) before the tables: each text's reading in full."""
    bare = PLACEHOLDER_RE.sub(" ", sample(text))
    readable = in_scripts(bare, detector._scripts)
    scores = ngram_scores(readable) if has_letters(readable) else None
    if scores is not None and (unserved := detector._unserved(scores)) is not None:
        return [unserved]
    words = list(dict.fromkeys(words_of(readable)))
    if scores is not None and words:
        floor = math.log(UNSERVED_MIN_FREQUENCY)
        ngrams = softmax(scores[detector._with_others])
        combined = []
        for index, code in enumerate((*detector.languages, *detector._others)):
            if index < len(detector.languages):
                links = COMPOUND_LINKS.get(code, ("",))
                found = (max(word_score(served[index], w, links), floor) for w in words)
            else:
                table = others[index - len(detector.languages)]
                found = (max(table.get(w, floor), floor) for w in words)
            combined.append(NGRAM_WEIGHT * math.log(max(float(ngrams[index]), 1e-300)) + sum(found))
        unserved_share = softmax(np.array(combined))[len(detector.languages) :]
        if float(unserved_share.sum()) >= UNSERVED_WORDS_CONFIDENCE:
            best = int(np.argmax(unserved_share))
            return [
                Detection(detector._others[best], round(100.0 * float(unserved_share[best]), 1))
            ]
    ngrams = softmax((scores if readable == bare else ngram_scores(bare))[detector._served])
    combined = [
        NGRAM_WEIGHT * math.log(max(probability, 1e-300))
        + sum(word_score(table, w, COMPOUND_LINKS.get(code, ("",))) for w in words_of(bare))
        for code, probability, table in zip(
            detector.languages, ngrams.tolist(), served, strict=True
        )
    ]
    weights = [math.exp(score - max(combined)) for score in combined]
    ranked = sorted(zip(detector.languages, weights, strict=True), key=lambda p: p[1], reverse=True)
    return [
        Detection(code, round(100.0 * w / sum(weights), 1)) for code, w in ranked[:TOP_CANDIDATES]
    ]


def test_detections_of_the_heldout_strings_are_those_of_the_dictionaries():
    detector = LanguageDetector(["en", "de"])
    served = [reference_table(code, "large", MIN_FREQUENCY) for code in detector.languages]
    others = [reference_table(code, "small", UNSERVED_MIN_FREQUENCY) for code in detector._others]
    texts = [text for texts in heldout_texts().values() for text in texts]
    texts += ["Send the file to Дмитрий Иванов", "東京", "Größe ändern", "%(count)s Elemente"]
    differing = [
        text
        for text in texts
        if detector.detect(text) != reference_detect(detector, text, served, others)
    ]
    assert not differing, differing[:5]
