"""Carry through what the model cannot spell: emoji, symbols, names in other scripts.

A subword vocabulary covers the characters of its training data. Anything else (``😀``,
``✔``, ``→``, ``東京``, ``Дмитрий``, a NUL) becomes the unknown piece, which the detokenizer
drops, or is changed by the tokenizer's normalisation (``ℹ️`` → ``i``, ``№`` → ``No``, ``…`` →
``...``). Either way the client's text is silently lost. This module finds such text and
protects it the way placeholders are protected (service/placeholders.py): masked with a
``｟k｠`` symbol before translation, constrained by the decoder to come back exactly once
(service/decoding.py, ``CopyConstraint``), restored verbatim after.

Decisions:

* **Ask the served model's tokenizer, per grapheme cluster.** A cluster (``regex``'s ``\\X``:
  a base with its combining marks, an emoji with its skin-tone modifier, ZWJ sequence or
  variation selector, a flag) is protected when :meth:`Tokenizer.spells` says the model cannot
  read it and write it back exactly; answers are cached per model. A second pass over the
  whole sentence catches pieces that are unknown only in context. What the tokenizer can
  spell is left to the model, so this holds for every model (ours, imported OPUS-MT) without
  retraining, and covers exactly what that model lacks.
* **Runs.** Neighbouring protected clusters, and protected clusters separated only by spaces,
  form one run (``Дмитрий Иванов`` is one name, one symbol). A protected letter inside a word
  takes the word with it (``Zoë``, not ``Zo`` + ``ë``): the model cannot translate a word it
  cannot spell, and a name cut in two tends to come back with a space inside.
* **Whitespace** (spaces of Unicode category Zs, tab, line feed, carriage return) is left to
  the model and the segmenter, as before. **Control characters** (NUL, ESC, form feed, C1,
  bidi and zero-width format characters) are not whitespace here: the model cannot spell them,
  so they are protected and come back where they were.
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

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

import regex

from service.placeholders import PLACEHOLDER_SYMBOLS, SYMBOL_CLOSE, SYMBOL_OPEN, find_placeholders
from service.placeholders import protect as protect_placeholders
from service.placeholders import restore as restore_placeholders
from service.tokenizer import Tokenizer

_GRAPHEME = regex.compile(r"\X")
_SYMBOL_RE = re.compile(rf"{SYMBOL_OPEN}\s*(\d+)\s*{SYMBOL_CLOSE}")
_MODEL_WHITESPACE = frozenset("\t\n\r")
# Distinct clusters whose verdict is kept per model: enough for every script and emoji in
# use; a client sending random combining sequences only makes the cache start over.
_VERDICT_CACHE_SIZE = 65_536

Span = tuple[int, int]


def is_model_whitespace(cluster: str) -> bool:
    """Spaces (category Zs), tab, LF and CR: left to the model and the segmenter."""
    return all(char in _MODEL_WHITESPACE or unicodedata.category(char) == "Zs" for char in cluster)


def _is_wordlike(cluster: str) -> bool:
    """A letter, digit or mark cluster: part of a word."""
    return unicodedata.category(cluster[0])[0] in "LNM"


def usable_symbols(tokenizer: Tokenizer) -> int:
    """How many of ``｟0｠``, ``｟1｠``, … (from 0, without a gap) the tokenizer has as single
    pieces that decode back to themselves: the symbols masking may use."""
    count = 0
    for symbol in PLACEHOLDER_SYMBOLS:
        pieces = [i for i in tokenizer.encode_one(symbol) if tokenizer.decode([i]) == symbol]
        if len(pieces) != 1:
            break
        count += 1
    return count


class RunProtector:
    """Masks placeholders and runs the model cannot spell, for one served model."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.symbols = usable_symbols(tokenizer)
        # Read and written from the event loop and from tokenizing worker threads: single
        # dict operations are atomic, and a lost verdict is only computed again.
        self._verdicts: dict[str, bool] = {}

    # --- finding runs ----------------------------------------------------------------------

    def spells(self, cluster: str) -> bool:
        """Whether the model can read and write ``cluster`` (whitespace always counts)."""
        verdict = self._verdicts.get(cluster)
        if verdict is None:
            verdict = is_model_whitespace(cluster) or self.tokenizer.spells(cluster)
            if len(self._verdicts) >= _VERDICT_CACHE_SIZE:
                self._verdicts.clear()
            self._verdicts[cluster] = verdict
        return verdict

    def runs(self, text: str, keep_out: Sequence[Span] = ()) -> list[Span]:
        """``(start, end)`` of every run of ``text`` the model cannot spell, left to right,
        none overlapping ``keep_out`` (placeholders, which have their own protection)."""
        unknown_in_context = self.tokenizer.unknown_spans(text)
        if not unknown_in_context and all(map(self.spells, set(_GRAPHEME.findall(text)))):
            return []  # the common case: one pass over the distinct clusters
        clusters = [match.span() for match in _GRAPHEME.finditer(text)]
        excluded = [_overlaps_any(span, keep_out) for span in clusters]
        protected = [
            not excluded[i]
            and not is_model_whitespace(text[start:end])  # a piece's "▁" covers a space
            and (
                not self.spells(text[start:end]) or _overlaps_any((start, end), unknown_in_context)
            )
            for i, (start, end) in enumerate(clusters)
        ]
        self._extend_to_words(text, clusters, protected, excluded)
        return self._group(text, clusters, protected)

    @staticmethod
    def _extend_to_words(
        text: str, clusters: list[Span], protected: list[bool], excluded: list[bool]
    ) -> None:
        seeds = [
            i
            for i, (start, end) in enumerate(clusters)
            if protected[i] and _is_wordlike(text[start:end])
        ]
        for seed in seeds:
            for step in (-1, 1):
                i = seed + step
                while 0 <= i < len(clusters) and not excluded[i]:
                    if not _is_wordlike(text[slice(*clusters[i])]):
                        break
                    protected[i] = True
                    i += step

    @staticmethod
    def _group(text: str, clusters: list[Span], protected: list[bool]) -> list[Span]:
        runs: list[list[int]] = []
        for (start, end), is_protected in zip(clusters, protected, strict=True):
            if not is_protected:
                continue
            between = text[runs[-1][1] : start] if runs else None
            if between is not None and (
                between == "" or all(unicodedata.category(c) == "Zs" for c in between)
            ):
                runs[-1][1] = end  # touching, or only spaces between: one run
            else:
                runs.append([start, end])
        return [(start, end) for start, end in runs]

    # --- masking ---------------------------------------------------------------------------

    def protect(self, text: str) -> tuple[str, list[str]]:
        """Mask placeholders and runs in one sentence: ``(masked, originals)``, where
        ``originals[k]`` is what ``｟k｠`` stands for (restore with
        :func:`restore_every_run`). A model without symbols gets placeholder masking alone
        (its runs are cut out by :meth:`cut_around_runs`)."""
        if not self.symbols:
            return protect_placeholders(text)
        placeholders = find_placeholders(text)
        spans = sorted([*placeholders, *self.runs(text, placeholders)])
        if not spans:
            return text, []
        spans = _merge_until_fits(text, spans, self.symbols)
        index_of: dict[str, int] = {}
        pieces: list[str] = []
        cursor = 0
        for start, end in spans:
            index = index_of.setdefault(text[start:end], len(index_of))
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
            masked_symbols = [match.span() for match in _SYMBOL_RE.finditer(sentence)]
            cursor = 0
            for run_start, run_end in [*self.runs(sentence, masked_symbols), (end - start,) * 2]:
                piece = sentence[cursor:run_start]
                if piece.strip():
                    left = len(piece) - len(piece.lstrip())
                    cut.append((start + cursor + left, start + cursor + len(piece.rstrip())))
                cursor = run_end
        return cut


def restore_every_run(masked_translation: str, originals: list[str], masked_source: str) -> str:
    """Put the originals back in place of the symbols; any symbol emitted fewer times than
    ``masked_source`` has it gets its original appended at the end (never lost)."""
    restored = restore_placeholders(masked_translation, originals)
    wanted = Counter(int(match.group(1)) for match in _SYMBOL_RE.finditer(masked_source))
    emitted = Counter(int(match.group(1)) for match in _SYMBOL_RE.finditer(masked_translation))
    missing = [
        originals[index]
        for index, count in sorted(wanted.items())
        if index < len(originals)
        for _ in range(count - emitted[index])
    ]
    return " ".join(part for part in (restored, *missing) if part)


def _overlaps_any(span: Span, others: Sequence[Span]) -> bool:
    start, end = span
    return any(start < other_end and other_start < end for other_start, other_end in others)


def _merge_until_fits(text: str, spans: list[Span], symbols: int) -> list[Span]:
    """Merge the two neighbours with the least text between them until the distinct
    strings fit in ``symbols``."""
    while len(spans) > 1 and len({text[start:end] for start, end in spans}) > symbols:
        closest = min(range(len(spans) - 1), key=lambda i: spans[i + 1][0] - spans[i][1])
        spans[closest : closest + 2] = [(spans[closest][0], spans[closest + 1][1])]
    return spans
