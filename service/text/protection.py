"""Protected spans: what must come back from the model byte for byte, masked as ``｟k｠``
symbols before translation and restored after. Two kinds share one numbering: placeholders
(markup, format fields, URLs) and runs the model cannot spell (emoji, symbols, other scripts).

Placeholders and the ``｟k｠`` symbols are found and written by service/text/placeholders.py;
what the model cannot spell is found by service/text/unspellable.py; this module masks both
in one numbering and restores them.

Decisions:

* **Symbols are shared** with placeholders: one numbering by first appearance over both,
  identical strings share a symbol.
* **More distinct protected strings than the model has symbols** (32 for the default model):
  the two neighbouring spans with the least text between them are merged into one span (that
  text then stays untranslated), until they fit. Nothing is dropped; the cost is a few words
  left in the source language, in sentences that are mostly symbols anyway.
* **Models without the symbols** (imported OPUS-MT checkpoints have no ``｟k｠`` pieces):
  :meth:`RunProtector.cut_around_runs` splits sentences at the runs, each piece is translated
  on its own and the runs stay verbatim in between.
* **Restoring**: a symbol the decoder did not emit as often as the source has it (only when
  ``max_new_tokens`` leaves no room for the symbols owed) has its original appended at the
  end rather than lost (:func:`restore_every_run`).

Runtime module: no torch, no numpy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import regex

from service.text.placeholders import (
    PLACEHOLDER_SYMBOLS,
    SYMBOL_OPEN,
    SYMBOL_RE,
    find_placeholders,
    protect,
    restore,
)
from service.text.spans import Span
from service.text.tokenizer import Tokenizer
from service.text.unspellable import UnspellableRuns


def symbol_piece_ids(tokenizer: Tokenizer) -> list[int | None]:
    """For each of ``｟0｠``, ``｟1｠``, …: the id of the single piece the tokenizer encodes it
    as and decodes back to it (the same id on the source and the target side), None where
    the vocabulary has no such piece."""
    ids: list[int | None] = []
    for symbol in PLACEHOLDER_SYMBOLS:
        pieces = [i for i in tokenizer.encode_one(symbol) if tokenizer.decode([i]) == symbol]
        ids.append(pieces[0] if len(pieces) == 1 else None)
    return ids


def placeholder_token_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The symbols' piece ids that the copy constraint watches (those the vocabulary has)."""
    return frozenset(i for i in symbol_piece_ids(tokenizer) if i is not None)


def usable_symbols(tokenizer: Tokenizer) -> int:
    """How many symbols, from ``｟0｠`` without a gap, the tokenizer has as single pieces:
    the symbols masking may use."""
    ids = symbol_piece_ids(tokenizer)
    return next((count for count, i in enumerate(ids) if i is None), len(ids))


class RunProtector:
    """Masks placeholders and runs the model cannot spell, for one served model."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.symbols = usable_symbols(tokenizer)
        self.unspellable = UnspellableRuns(tokenizer)

    def protect(self, text: str, terms: Sequence[tuple[Span, str]] = ()) -> tuple[str, list[str]]:
        """Mask placeholders and runs in one sentence: ``(masked, originals)``, where
        ``originals[k]`` is what ``｟k｠`` stands for (restore with
        :func:`restore_every_run`). ``terms``: glossary matches (service/text/glossary.py),
        ``(span, target term)``, none overlapping a placeholder; each is masked like a
        placeholder but stands for its TARGET term, so restoring writes the target term. A
        model without symbols gets placeholder masking alone (its runs are cut out by
        :meth:`cut_around_runs`; the pipeline refuses glossaries for it)."""
        if not self.symbols:
            return protect(text)
        placeholders = find_placeholders(text)
        keep_out = [*placeholders, *(span for span, _ in terms)]
        spans = sorted([*keep_out, *self.unspellable.runs(text, keep_out)])
        if not spans:
            return text, []
        target_of = dict(terms)

        def value(span: Span) -> str:
            """What a (possibly merged) span stands for: its text, with the glossary terms
            inside it replaced by their targets."""
            start, end = span
            pieces, cursor = [], start
            for (term_start, term_end), target in sorted(target_of.items()):
                if start <= term_start and term_end <= end:
                    pieces += [text[cursor:term_start], target]
                    cursor = term_end
            return "".join([*pieces, text[cursor:end]])

        spans = _merge_until_fits(text, spans, self.symbols, value)
        index_of: dict[str, int] = {}
        pieces: list[str] = []
        cursor = 0
        for start, end in spans:
            index = index_of.setdefault(value((start, end)), len(index_of))
            pieces += [text[cursor:start], PLACEHOLDER_SYMBOLS[index]]
            cursor = end
        pieces.append(text[cursor:])
        return "".join(pieces), list(index_of)

    def cut_around_runs(self, text: str, spans: Sequence[Span]) -> list[Span]:
        """Sentence ``spans`` of ``text`` (placeholders already masked) with the runs cut
        out, for a model without symbols: the runs fall between spans, where the segmenter's
        join keeps them verbatim. With symbols, ``spans`` unchanged."""
        if self.symbols:
            return list(spans)
        cut: list[Span] = []
        for start, end in spans:
            sentence = text[start:end]
            masked_symbols = [match.span() for match in SYMBOL_RE.finditer(sentence)]
            runs = self.unspellable.runs(sentence, masked_symbols)
            cursor = 0
            for run_start, run_end in [*runs, (end - start,) * 2]:
                piece = sentence[cursor:run_start]
                if piece.strip():
                    left = len(piece) - len(piece.lstrip())
                    cut.append((start + cursor + left, start + cursor + len(piece.rstrip())))
                cursor = run_end
        return cut


def restore_every_run(masked_translation: str, originals: list[str], masked_source: str) -> str:
    """Put the originals back in place of the symbols; any symbol emitted fewer times than
    ``masked_source`` has it gets its original appended at the end (never lost)."""
    restored = restore(masked_translation, originals)
    if SYMBOL_OPEN not in masked_source:
        return restored  # nothing owed
    wanted = Counter(int(match.group(1)) for match in SYMBOL_RE.finditer(masked_source))
    emitted = Counter(int(match.group(1)) for match in SYMBOL_RE.finditer(masked_translation))
    missing = [
        originals[index]
        for index, count in sorted(wanted.items())
        if index < len(originals)
        for _ in range(count - emitted[index])
    ]
    return " ".join(part for part in (restored, *missing) if part)


def _merge_until_fits(
    text: str, spans: list[Span], symbols: int, value: Callable[[Span], str] | None = None
) -> list[Span]:
    """Merge the two neighbours with the least text between them until the distinct
    strings (``value`` of each span: what its symbol restores to) fit in ``symbols``."""
    value = value or (lambda span: text[span[0] : span[1]])
    while len(spans) > 1 and len(set(map(value, spans))) > symbols:
        closest = min(range(len(spans) - 1), key=lambda i: spans[i + 1][0] - spans[i][1])
        spans[closest : closest + 2] = [(spans[closest][0], spans[closest + 1][1])]
    return spans


# The documents' formatting boundaries (service/text/documents/inline.py, xliff.py): a run's
# bold or a CAT tool's ``<g>`` inside a sentence, not markup a UI string carries.
_FORMATTING_TAG = regex.compile(r"</?mt-g\d+\s*/?>")
Glued = tuple[tuple[int, str], ...]  # (symbol index, "left" or "right")


def space_out_formatting(masked: str, originals: Sequence[str]) -> tuple[str, Glued]:
    """``masked`` with a space between a formatting boundary's symbol and a letter glued to
    it, and the sides spaced out. A word glued to a symbol is tokenized as the middle of a
    word (``｟0｠all`` has no word start), and the model copies such pieces as it copies
    identifiers: ``Delete <g>all</g> files?`` came back with ``all`` untranslated, and a
    bold run of a slide half in English. :func:`tighten` takes the spaces out again."""
    if SYMBOL_OPEN not in masked:
        return masked, ()
    glued: list[tuple[int, str]] = []
    pieces: list[str] = []
    cursor = 0
    for match in SYMBOL_RE.finditer(masked):
        index = int(match.group(1))
        if index >= len(originals) or not _FORMATTING_TAG.fullmatch(originals[index]):
            continue
        start, end = match.span()
        pieces.append(masked[cursor:start])
        if start > 0 and masked[start - 1].isalnum():
            pieces.append(" ")
            glued.append((index, "left"))
        pieces.append(match.group())
        if end < len(masked) and masked[end].isalnum():
            pieces.append(" ")
            glued.append((index, "right"))
        cursor = end
    pieces.append(masked[cursor:])
    return "".join(pieces), tuple(glued)


def tighten(masked_translation: str, glued: Glued) -> str:
    """The model's output with the spaces :func:`space_out_formatting` added taken out: no
    space on the side of a symbol where the source had none."""
    for index, side in glued:
        symbol = rf"｟\s*{index}\s*｠"
        pattern = rf"\s+({symbol})" if side == "left" else rf"({symbol})\s+"
        masked_translation = regex.sub(pattern, r"\1", masked_translation)
    return masked_translation
