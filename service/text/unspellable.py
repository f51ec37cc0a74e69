"""What the model cannot spell: the runs of a sentence that the served model's vocabulary
cannot read and write back exactly, found so that service/text/protection.py can mask them.

A subword vocabulary covers the characters of its training data. Anything else (``😀``,
``✔``, ``→``, ``東京``, ``Дмитрий``, a NUL) becomes the unknown piece, which the detokenizer
drops, or is changed by the tokenizer's normalisation (``ℹ️`` → ``i``, ``№`` → ``No``, ``…`` →
``...``). Either way the client's text is silently lost. ``UnspellableRuns`` finds such text,
and service/text/protection.py protects it the way placeholders are protected: masked with a
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
  spells them** (:func:`is_symbol`, :meth:`UnspellableRuns.lone_letters`): a model drops ``©``,
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

Runtime module: no torch, no numpy.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import regex

from service.text.spans import Span, overlaps_any
from service.text.tokenizer import Tokenizer

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


class UnspellableRuns:
    """Finds the runs of a sentence that one served model cannot spell."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        # Read and written from the event loop and from tokenizing worker threads: single
        # dict operations are atomic, and a lost verdict is only computed again.
        self._verdicts: dict[str, bool] = {}

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
        if not unknown_in_context and text.isascii() and all(map(self.leaves_to_model, set(text))):
            # ASCII text, the most common: each character is a cluster of its own (a CRLF
            # pair aside, whitespace either way) and no letter is foreign (``lone_letters``),
            # so the characters decide without the grapheme and lone-letter scans
            return []
        lone = self.lone_letters(text)
        if (
            not unknown_in_context
            and not lone
            and all(map(self.leaves_to_model, set(_GRAPHEME.findall(text))))
        ):
            return []  # the common case: one pass over the distinct clusters
        clusters = [match.span() for match in _GRAPHEME.finditer(text)]
        excluded = [overlaps_any(span, keep_out) for span in clusters]
        protected = [
            not excluded[i]
            and not is_model_whitespace(text[start:end])  # a piece's "▁" covers a space
            and (
                not self.leaves_to_model(text[start:end])
                or overlaps_any((start, end), unknown_in_context)
                or overlaps_any((start, end), lone)
            )
            for i, (start, end) in enumerate(clusters)
        ]
        self._extend_to_words(text, clusters, protected, excluded)
        # After the extension to words: an amount's digits protect the amount, not the word
        # the amount touches.
        amounts = [match.span() for match in _CURRENCY_AMOUNT.finditer(text)]
        for i, span in enumerate(clusters):
            if not excluded[i] and overlaps_any(span, amounts):
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
