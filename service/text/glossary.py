"""Glossaries: source terms that must come out as one exact target term.

A glossary maps source terms to target terms. In a sentence, its terms are found (matching
below) and protected the way placeholders are (service/text/protection.py): each match is
masked as a ``｟k｠`` symbol, the decoder's copy constraint brings every symbol back exactly
as often as the source has it, and restoring puts the TARGET term where the symbol is. So
the target term appears exactly as often as its source term matched, whatever the model
would have made of the words.

Matching:

* **case-insensitive** (``Save``, ``save`` and ``SAVE`` all match ``save``), spaces inside a
  term match any run of whitespace;
* **at word boundaries**: no letter, digit or underscore directly before or after a match, so
  ``file`` does not match inside ``profile``;
* **longest first**: where matches overlap, the longest wins (``file manager`` over ``file``),
  then the leftmost;
* **never inside markup**: a match overlapping a placeholder (a tag, a format field, a URL)
  is dropped; placeholders keep their own protection.

The contract is the exact target term, uninflected: a target language that declines or
conjugates the term gets it in the form the glossary gives, always (docs/glossaries.md).

Validation refuses, with a :class:`GlossaryError` that says which entry: no entries, more
than the limit, empty or over-long terms, control characters, a term that holds a
placeholder or a ``｟k｠`` bracket (it could not be matched outside markup, or would collide
with the masking), and a source term given twice (which target would win is not for the
service to guess).

Runtime module: no torch, no numpy.
"""

from __future__ import annotations

import csv
import io
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import regex

from service.errors import InputTooLarge, TextError
from service.text.placeholders import SYMBOL_CLOSE, SYMBOL_OPEN, find_placeholders
from service.text.spans import Span, overlaps_any

MAX_TERM_CHARS = 200


class GlossaryError(TextError):
    """A glossary the service cannot enforce as given (HTTP 400)."""


def term_key(term: str) -> str:
    """What two spellings of one source term share: case folded, whitespace runs as one
    space (the key duplicates are found by and matches are looked up by)."""
    return " ".join(term.split()).casefold()


def _check_term(term: object, side: str, index: int) -> str:
    if not isinstance(term, str) or not term.strip():
        raise GlossaryError(
            "empty_glossary_term", f"glossary entry {index}: the {side} term is empty"
        )
    if len(term) > MAX_TERM_CHARS:
        raise GlossaryError(
            "glossary_term_too_long",
            f"glossary entry {index}: the {side} term has {len(term)} characters; "
            f"the limit is {MAX_TERM_CHARS}",
        )
    # Tabs and newlines would break the TSV the entries are exported as; other control
    # characters are never part of a term a reader can see.
    if any(unicodedata.category(char) == "Cc" for char in term):
        raise GlossaryError(
            "invalid_glossary_term",
            f"glossary entry {index}: the {side} term {term!r} holds a control character",
        )
    if SYMBOL_OPEN in term or SYMBOL_CLOSE in term:
        raise GlossaryError(
            "invalid_glossary_term",
            f"glossary entry {index}: the {side} term {term!r} holds a reserved ｟ ｠ bracket",
        )
    if side == "source" and find_placeholders(term):
        raise GlossaryError(
            "glossary_term_has_placeholder",
            f"glossary entry {index}: the source term {term!r} holds markup or a format "
            "field, which are protected as they are and never matched",
        )
    return term.strip()


@dataclass(frozen=True)
class Glossary:
    """Validated entries, compiled for matching. ``source_lang``/``target_lang``: the pair a
    stored glossary is for (None for an inline one, which holds for the request's pair)."""

    entries: tuple[tuple[str, str], ...]
    source_lang: str | None = None
    target_lang: str | None = None
    _targets: dict[str, str] = field(init=False, repr=False, compare=False)
    _pattern: regex.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        targets = {term_key(source): target for source, target in self.entries}
        # Longest term first: at one position the alternation takes the first alternative
        # that matches, so a longer term beats its own prefix.
        terms = sorted({term_key(source) for source, _ in self.entries}, key=len, reverse=True)
        alternatives = "|".join(r"\s+".join(map(regex.escape, term.split())) for term in terms)
        pattern = regex.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", regex.IGNORECASE)
        object.__setattr__(self, "_targets", targets)
        object.__setattr__(self, "_pattern", pattern)

    @classmethod
    def from_entries(
        cls,
        entries: Iterable[tuple[object, object]],
        max_entries: int,
        source_lang: str | None = None,
        target_lang: str | None = None,
    ) -> Glossary:
        """Check ``entries`` (``(source, target)`` pairs) and compile them; raises
        :class:`GlossaryError` (400) or ``InputTooLarge`` (413) naming the bad entry."""
        checked: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for index, (source, target) in enumerate(entries):
            if len(checked) >= max_entries:
                raise InputTooLarge(
                    "too_many_glossary_entries",
                    f"the glossary has more than {max_entries} entries, the limit "
                    f"MT_MAX_GLOSSARY_ENTRIES={max_entries}",
                )
            source = _check_term(source, "source", index)
            target = _check_term(target, "target", index)
            key = term_key(source)
            if key in seen:
                raise GlossaryError(
                    "duplicate_glossary_term",
                    f"glossary entry {index}: the source term {source!r} is already entry "
                    f"{seen[key]} (terms match case-insensitively)",
                )
            seen[key] = index
            checked.append((source, target))
        if not checked:
            raise GlossaryError("empty_glossary", "the glossary has no entries")
        return cls(tuple(checked), source_lang, target_lang)

    def matches(self, text: str, keep_out: Sequence[Span] = ()) -> list[tuple[Span, str]]:
        """``((start, end), target term)`` of every match in ``text``, left to right: longest
        first where matches overlap, none overlapping ``keep_out`` (placeholders)."""
        found = []
        for match in self._pattern.finditer(text, overlapped=True):
            target = self._targets.get(term_key(match.group()))
            if target is not None:
                found.append(match.span())
        chosen: list[Span] = []
        for span in sorted(found, key=lambda s: (s[0] - s[1], s[0])):
            if not overlaps_any(span, keep_out) and not overlaps_any(span, chosen):
                chosen.append(span)
        return [(span, self._targets[term_key(text[slice(*span)])]) for span in sorted(chosen)]


def parse_entries(data: str, entries_format: str) -> list[tuple[str, str]]:
    """Entries from an uploaded file: ``tsv`` (source TAB target per line) or ``csv``
    (``source,target`` and, as DeepL's CSV has them, optional language columns, ignored).
    Blank lines are skipped; a line without two fields is refused with its number."""
    if entries_format not in ("tsv", "csv"):
        raise GlossaryError(
            "invalid_entries_format", f"entries_format must be tsv or csv, not {entries_format!r}"
        )
    if entries_format == "tsv":
        rows = [line.split("\t") for line in data.splitlines()]
    else:
        rows = list(csv.reader(io.StringIO(data)))
    entries = []
    for number, row in enumerate(rows, start=1):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < 2 or (entries_format == "tsv" and len(row) != 2):
            raise GlossaryError(
                "invalid_glossary_entries",
                f"line {number} of the {entries_format} entries does not hold a source and a "
                "target term",
            )
        entries.append((row[0], row[1]))
    return entries


def entries_tsv(entries: Iterable[tuple[str, str]]) -> str:
    """The entries as TSV (DeepL's ``/glossaries/{id}/entries``)."""
    return "".join(f"{source}\t{target}\n" for source, target in entries)
