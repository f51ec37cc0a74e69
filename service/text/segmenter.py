"""Sentence splitting for translation: each sentence becomes one row of the batch.

Why a small rule set and not a library: the texts are mostly short software strings, we need
exact character spans (the whitespace between sentences is kept byte for byte around the
translations), and the candidates on PyPI either have had no release for years (pysbd,
2021) or bring a native binary (sentencex's recent builds). A missed split costs little (a
longer row); a wrong split inside "z. B." or "e.g." hurts the translation, so the rules
lean towards not splitting.

Rules (``SentenceSplit.LINES_AND_PUNCTUATION``, the default; DeepL's ``split_sentences``
picks another: ``nonewlines`` splits at punctuation only, ``0`` not at all):

* a line break always ends a sentence (UI texts put one item per line);
* ``. ! ? …`` (plus closing quotes/brackets), then spaces, then a character that is not a
  lower-case letter ends a sentence, except that a full stop does not end one after a known
  abbreviation of English, German, French or Spanish, an initial ("J. Smith"), a dotted
  acronym ("U.S.") or, in German, an ordinal number ("am 3. Oktober").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum


class SentenceSplit(Enum):
    """Where sentences end (the values are DeepL's ``split_sentences``)."""

    LINES_AND_PUNCTUATION = "1"
    PUNCTUATION = "nonewlines"  # a line break is a space inside a sentence
    NONE = "0"  # the whole text is one sentence


# Lower-cased, without the final full stop.
_ABBREVIATION_LIST = (
    # English
    "mr mrs ms dr prof sr jr st vs etc e.g i.e approx dept est fig figs inc ltd co corp no "
    "nos vol vols jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun "
    "misc ca cf al ed eds p pp ref min max op"
    # German
    " z.b bzw usw ggf evtl vgl nr str hr fr bspw inkl zzgl d.h u.a s.o s.u u.ä usf sog z.t abs "
    "mio mrd bzgl ca gem geb hrsg jh tel"
    # French
    " m mme mlle mm p.ex env nº n° av apr j.-c éd chap"
    # Spanish
    " sra srta dra ud uds pág ej p.ej aprox avda núm tfno"
)
_ABBREVIATIONS: frozenset[str] = frozenset(_ABBREVIATION_LIST.split())

# Terminal punctuation with any closing quotes or brackets, then horizontal whitespace (any
# whitespace when a line break does not end a sentence). The run of punctuation is read from
# its first mark only and possessively (the three classes are disjoint), so a long run of
# dots without a space is read once.
_SENTENCE_END = re.compile(r"(?<![.!?…])([.!?…]++[\"'”’»)\]]*+)([ \t\u00a0\u202f]++)")
_SENTENCE_END_ANY_SPACE = re.compile(r"(?<![.!?…])([.!?…]++[\"'”’»)\]]*+)(\s++)")
_LINE = re.compile(r"[^\n\r]+")
_WHOLE = re.compile(r"[\s\S]+")
_OPENING_PUNCTUATION = "([{\"'“‘«¿¡"


def sentence_spans(
    text: str, language: str = "en", split: SentenceSplit = SentenceSplit.LINES_AND_PUNCTUATION
) -> list[tuple[int, int]]:
    """``(start, end)`` of every sentence in ``text``, left to right, whitespace excluded.

    Whitespace-only text has no sentences. The text between two spans (and before the first
    and after the last) is whitespace that :func:`join_translations` puts back unchanged.
    """
    by_lines = split is SentenceSplit.LINES_AND_PUNCTUATION
    sentence_end = _SENTENCE_END if by_lines else _SENTENCE_END_ANY_SPACE
    spans: list[tuple[int, int]] = []
    for line in (_LINE if by_lines else _WHOLE).finditer(text):
        line_start, line_end = _strip_span(text, *line.span())
        if line_start == line_end:
            continue
        if split is SentenceSplit.NONE:
            spans.append((line_start, line_end))
            continue
        sentence_start = line_start
        for end in sentence_end.finditer(text, line_start, line_end):
            next_start = end.end()
            if next_start >= line_end:
                break  # trailing whitespace of the line, not a boundary
            if _is_boundary(text, sentence_start, end, text[next_start], language):
                spans.append((sentence_start, end.end(1)))
                sentence_start = next_start
        spans.append((sentence_start, line_end))
    return spans


def join_translations(
    text: str, spans: Sequence[tuple[int, int]], translations: Sequence[str]
) -> str:
    """Replace each span of ``text`` by its translation, keeping the whitespace around them."""
    if len(spans) != len(translations):
        raise ValueError(f"{len(spans)} spans but {len(translations)} translations")
    pieces: list[str] = []
    cursor = 0
    for (start, end), translation in zip(spans, translations, strict=True):
        pieces.append(text[cursor:start])
        pieces.append(translation)
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _is_boundary(
    text: str, sentence_start: int, end: re.Match[str], next_char: str, language: str
) -> bool:
    if next_char.islower():
        return False  # "etc. and", "z. B. der", "Vraiment ? non"
    punctuation = end.group(1)
    if any(mark in punctuation for mark in "!?…") or punctuation.startswith(".."):
        return True
    # A single full stop: look at the word it ends.
    before = text[sentence_start : end.start(1)]
    word = before.rsplit(maxsplit=1)[-1] if before.strip() else ""
    word = word.lstrip(_OPENING_PUNCTUATION)
    if not word:
        return True
    if word.lower() in _ABBREVIATIONS:
        return False
    if len(word) == 1 and word.isalpha():
        return False  # an initial: "J. Smith"
    if "." in word and all(len(part) <= 1 for part in word.split(".")):
        return False  # dotted acronym: "U.S.", "z.B" written without spaces
    return not (language == "de" and word.isdigit())  # German ordinal: "am 3. Oktober"


# Both start only where their run starts (the lookbehinds) and read it once: a run that
# does not end the text, or whitespace without a line break, is not rescanned from each of
# its characters.
_FINAL_PUNCTUATION = re.compile(r"(?<![.!?…:;。！？])[.!?…:;。！？]*+$")
_LINE_BREAKS = re.compile(r"(?<!\s)[^\S\r\n]*+[\r\n]\s*+")


def one_line(sentence: str) -> str:
    """A sentence that spans lines (split at punctuation only) as the model reads it."""
    return _LINE_BREAKS.sub(" ", sentence)


def keep_formatting(source: str, translation: str) -> str:
    """``translation`` with the case of ``source``'s first letter and ``source``'s final
    punctuation (DeepL's ``preserve_formatting``): a model writes every sentence capitalised
    and closed by a full stop, which a UI label ("save as…", "file name") is not."""
    first_source = next((char for char in source if char.isalpha()), "")
    first_index = next((i for i, char in enumerate(translation) if char.isalpha()), None)
    if first_index is not None and first_source:
        first = translation[first_index]
        first = first.lower() if first_source.islower() else first.upper()
        translation = f"{translation[:first_index]}{first}{translation[first_index + 1 :]}"
    body = translation.rstrip()
    trailing = translation[len(body) :]
    source_end = _FINAL_PUNCTUATION.search(source.rstrip())
    end = _FINAL_PUNCTUATION.search(body)
    assert source_end is not None and end is not None  # the pattern matches the empty end
    return f"{body[: end.start()]}{source_end.group()}{trailing}"
