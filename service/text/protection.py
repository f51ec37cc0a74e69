"""Protected spans: what must come back from the model byte for byte, masked as ``｟k｠``
symbols before translation and restored after. Two kinds share one numbering: placeholders
(markup, format fields, URLs) and runs the model cannot spell (emoji, symbols, other scripts).

Placeholders and the ``｟k｠`` symbols are found and written by service/text/placeholders.py;
this module finds what the model cannot spell and masks both in one numbering.

## What the model cannot spell

A subword vocabulary covers the characters of its training data. Anything else (``😀``,
``✔``, ``→``, ``東京``, ``Дмитрий``, a NUL) becomes the unknown piece, which the detokenizer
drops, or is changed by the tokenizer's normalisation (``ℹ️`` → ``i``, ``№`` → ``No``, ``…`` →
``...``). Either way the client's text is silently lost. ``RunProtector`` finds such text and
protects it the way placeholders are protected: masked with a
``｟k｠`` symbol before translation, constrained by the decoder to come back exactly once
(service/runtime/search.py, ``CopyConstraint``), restored verbatim after.

Decisions:

* **Ask the served model's tokenizer, per grapheme cluster.** A cluster (``regex``'s ``\\X``:
  a base with its combining marks, an emoji with its skin-tone modifier, ZWJ sequence or
  variation selector, a flag) is protected when :meth:`Tokenizer.spells` says the model cannot
  read it and write it back exactly; answers are cached per model. A second pass over the
  whole sentence catches pieces that are unknown only in context. What the tokenizer can
  spell is left to the model, so this holds for every model (ours, imported OPUS-MT) without
  retraining, and covers exactly what that model lacks.
* **Symbols, pictographs and lone foreign letters are protected even where the tokenizer
  spells them** (:func:`is_symbol`, :meth:`RunProtector.lone_letters`): a model drops ``©``,
  ``→`` or a stray ``ß`` at will although its vocabulary has them. Categories ``S*`` and
  emoji; a letter alone as a word, of another script than the sentence's words or a cased
  non-ASCII letter the vocabulary has no word piece for; a currency sign with the number it
  touches (the amount comes back as written). Punctuation (``P*``: quotes, dashes) stays the
  model's, which rewrites it legitimately (``"x"`` → ``„x“``).
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

import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence

import regex

from service.text.placeholders import (
    PLACEHOLDER_SYMBOLS,
    SYMBOL_RE,
    find_placeholders,
    protect,
    restore,
)
from service.text.tokenizer import Tokenizer

# --- what the model cannot spell ----------------------------------------------------------

_GRAPHEME = regex.compile(r"\X")
_PICTOGRAPH = regex.compile(r"\p{Extended_Pictographic}|\uFE0F|\u20E3")
# A letter with its marks, with no letter, mark or digit on either side.
_LONE_LETTER = regex.compile(r"(?<![\p{L}\p{M}\p{N}])\p{L}\p{M}*(?![\p{L}\p{M}\p{N}])")
_WORD = regex.compile(r"\p{L}[\p{L}\p{M}]*")
_EAST_ASIAN = frozenset({"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "BOPOMOFO", "IDEOGRAPHIC"})
# A currency sign with the number it touches (at most one space between): one run, so the
# amount comes back as the client formatted it ("$5.99", "5 €", "€ 1,200").
# A number is digit groups joined by separators, read possessively: the longest such run is
# the only one a currency sign can touch, so giving digits back never finds another match.
_SEPARATOR = r"[.,'\u00a0\u202f]"
_NUMBER = rf"\d++(?:{_SEPARATOR}++\d++)*+"
# An amount before its sign starts at the first digit of its number (no digit before it
# across separators), so a long number without a sign is read once, not from each digit.
_NUMBER_START = rf"\d(?<!\d{_SEPARATOR}*+\d)"
_CURRENCY_AMOUNT = regex.compile(
    rf"\p{{Sc}}[ \u00a0\u202f]?{_NUMBER}"
    rf"|(?={_NUMBER_START}){_NUMBER}[ \u00a0\u202f]?\p{{Sc}}"
)
_MODEL_WHITESPACE = frozenset("\t\n\r")
# Distinct clusters whose verdict is kept per model: enough for every script and emoji in
# use; a client sending random combining sequences only makes the cache start over.
_VERDICT_CACHE_SIZE = 65_536

Span = tuple[int, int]


def is_model_whitespace(cluster: str) -> bool:
    """Spaces (category Zs), tab, LF and CR: left to the model and the segmenter."""
    return all(char in _MODEL_WHITESPACE or unicodedata.category(char) == "Zs" for char in cluster)


def is_symbol(cluster: str) -> bool:
    """A cluster with a character of category S* (``© ™ → € + $``) or a pictograph (emoji,
    with its modifiers and sequences; ``‼`` and keycaps ``1️⃣`` too): protected whether or
    not the vocabulary has a piece for it, since a model drops or rewrites such characters
    at will (``Do not ask © again`` came back without the ``©``)."""
    return any(unicodedata.category(char)[0] == "S" for char in cluster) or bool(
        _PICTOGRAPH.search(cluster)
    )


def _is_wordlike(cluster: str) -> bool:
    """A letter, digit or mark cluster: part of a word (a keycap emoji is not)."""
    return unicodedata.category(cluster[0])[0] in "LNM" and not is_symbol(cluster)


def _script(letter: str) -> str:
    """The script of a letter by its Unicode name (``LATIN``, ``CYRILLIC``, ``GREEK``);
    Han, kana and Hangul count as one, since Japanese and Korean text mixes them."""
    if letter.isascii():
        return "LATIN"
    word = unicodedata.name(letter, "UNKNOWN").split(" ", 1)[0]
    return "CJK" if word in _EAST_ASIAN else word


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
        # Read and written from the event loop and from tokenizing worker threads: single
        # dict operations are atomic, and a lost verdict is only computed again.
        self._verdicts: dict[str, bool] = {}

    # --- finding runs ----------------------------------------------------------------------

    def leaves_to_model(self, cluster: str) -> bool:
        """Whether ``cluster`` is the model's to translate: whitespace, or what the model can
        read and write back that is neither a symbol nor a pictograph (:func:`is_symbol`)."""
        verdict = self._verdicts.get(cluster)
        if verdict is None:
            verdict = is_model_whitespace(cluster) or (
                not is_symbol(cluster) and self.tokenizer.spells(cluster)
            )
            if len(self._verdicts) >= _VERDICT_CACHE_SIZE:
                self._verdicts.clear()
            self._verdicts[cluster] = verdict
        return verdict

    def runs(self, text: str, keep_out: Sequence[Span] = ()) -> list[Span]:
        """``(start, end)`` of every run of ``text`` the model cannot spell, left to right,
        none overlapping ``keep_out`` (placeholders, which have their own protection)."""
        unknown_in_context = self.tokenizer.unknown_spans(text)
        lone = self.lone_letters(text)
        if (
            not unknown_in_context
            and not lone
            and all(map(self.leaves_to_model, set(_GRAPHEME.findall(text))))
        ):
            return []  # the common case: one pass over the distinct clusters
        clusters = [match.span() for match in _GRAPHEME.finditer(text)]
        excluded = [_overlaps_any(span, keep_out) for span in clusters]
        protected = [
            not excluded[i]
            and not is_model_whitespace(text[start:end])  # a piece's "▁" covers a space
            and (
                not self.leaves_to_model(text[start:end])
                or _overlaps_any((start, end), unknown_in_context)
                or _overlaps_any((start, end), lone)
            )
            for i, (start, end) in enumerate(clusters)
        ]
        self._extend_to_words(text, clusters, protected, excluded)
        # After the extension to words: an amount's digits protect the amount, not the word
        # the amount touches.
        amounts = [match.span() for match in _CURRENCY_AMOUNT.finditer(text)]
        for i, span in enumerate(clusters):
            if not excluded[i] and _overlaps_any(span, amounts):
                protected[i] = True
        return self._group(text, clusters, protected)

    def lone_letters(self, text: str) -> list[Span]:
        """``(start, end)`` of every letter that stands alone as a word (a letter with its
        marks, no letter or digit either side) and is foreign to the sentence: of a script
        the sentence has no longer word in, beside words of another (``Ж`` or ``α`` in
        English), or a cased letter
        outside ASCII that the vocabulary does not have as a word of its own (a stray ``ß``
        between English words; French ``à`` stays the model's where its vocabulary has
        ``▁à``). Scripts without case (Han, Thai, …) write words without spaces, so a lone
        character of the sentence's own script there is an ordinary word."""
        candidates = [match.span() for match in _LONE_LETTER.finditer(text)]
        if not candidates:
            return []
        if text.isascii():
            return []  # "a", "I", "x" in ASCII text: words of the sentence's own script
        # The scripts the sentence writes words of two letters or more in: a lone letter of
        # none of them, beside words of another, is foreign (majorities by letter would
        # make the English "a" foreign in "Send Дмитрий Иванов a file").
        word_scripts = {
            _script(word[0]) for word in _WORD.findall(text) if sum(map(str.isalpha, word)) > 1
        }
        lone: list[Span] = []
        for start, end in candidates:
            letter = text[start:end]
            script = _script(letter[0])
            if (word_scripts and script not in word_scripts) or (
                not letter.isascii()
                and letter[0].lower() != letter[0].upper()
                and not self.tokenizer.has_word(letter)
            ):
                lone.append((start, end))
        return lone

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
        term_spans = [span for span, _ in terms]
        spans = sorted([*placeholders, *term_spans, *self.runs(text, [*placeholders, *term_spans])])
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
    restored = restore(masked_translation, originals)
    wanted = Counter(int(match.group(1)) for match in SYMBOL_RE.finditer(masked_source))
    emitted = Counter(int(match.group(1)) for match in SYMBOL_RE.finditer(masked_translation))
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
