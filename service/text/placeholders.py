"""Placeholders: what a software string carries that must come back byte for byte, and the
reserved ``｟k｠`` symbols that stand for it while the model translates.

Software strings carry things a translation must reproduce byte for byte: printf and brace
format fields, template variables, HTML tags, entities, URLs. A subword model trained on a
few tens of thousands of UI strings garbles them (``%(name)s`` → ``% (Name) s``). So before
translation every such span is replaced by a reserved symbol ``｟k｠`` that the tokenizer keeps
as one piece (it is a SentencePiece ``user_defined_symbol``), and after translation the
symbols are swapped back for the original spans.

Symbol convention: ``｟0｠`` … ``｟{MAX_PLACEHOLDERS-1}｠`` (U+FF5F / U+FF60, the OpenNMT
placeholder brackets, which never occur in UI text). ``k`` is the order of first appearance
in the source; identical spans share one index. Spans beyond ``MAX_PLACEHOLDERS`` distinct
ones are left as they are.

Masking by placeholder alone (``protect``, ``restore``) serves training (``mask_pair``) and
evaluation (``survival_rate``); serving masks placeholders and what the model cannot spell in
one numbering (service/text/protection.py).

Runtime module: no torch, no numpy.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

MAX_PLACEHOLDERS = 32
SYMBOL_OPEN = "\uff5f"  # ｟
SYMBOL_CLOSE = "\uff60"  # ｠
PLACEHOLDER_SYMBOLS: tuple[str, ...] = tuple(
    f"{SYMBOL_OPEN}{index}{SYMBOL_CLOSE}" for index in range(MAX_PLACEHOLDERS)
)
"""Reserved pieces, in index order: pass them to SentencePiece as ``user_defined_symbols``."""

# One alternation, most specific first: the regex engine takes the first alternative that
# matches at a position, so `%(name)s` must be tried before a bare `%`-form and `{{ x }}`
# before `{x}`. Every alternative takes time linear in the text (a client controls the text):
# no alternative rescans, from each position of a run, the rest of that run.
_PLACEHOLDER_PATTERNS: tuple[str, ...] = (
    # HTML/XML tags, with attributes: <b>, </a>, <br/>, <a href="...">
    r"</?[A-Za-z][A-Za-z0-9:_.-]*+(?:/|\s[^<>]*+)?>",
    # URLs (trailing sentence punctuation is trimmed below)
    r"(?:https?|ftp)://[^\s<>\"']+",
    # e-mail addresses; the address starts where its run of address characters starts, so a
    # long run without an `@` is read once, not once from each of its characters
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]++@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+",
    # Jinja/Django template variables and tags: {{ user.name }}, {% trans %}
    r"\{\{[^{}]*\}\}",
    # (a tag ends before the next `{%` opens: tags do not nest)
    r"\{%(?:(?!\{%)[^\n])*?%\}",
    # escaped braces in Python/.NET format strings
    r"\{\{|\}\}",
    # shell/JS ${x}, LibreOffice/make $(ARG1)
    r"\$\{[^{}\s]*\}",
    r"\$\([A-Za-z0-9_]+\)",
    # Python/.NET braces: {0}, {name}, {0:.2f}, {name!r}, {}
    r"\{[A-Za-z0-9_.\[\]]*(?:![rsa])?(?::[^{}\s]*)?\}",
    # printf: %s %d %(name)s %1$s %.2f %-10s %lu %zu %%  (no space flag: "50% discount")
    # (flags, width and precision read possessively: a digit given back cannot end the field)
    r"%(?:\([A-Za-z0-9_.-]+\))?(?:\d++\$)?[-+0#']*+(?:\d++|\*)?(?:\.(?:\d++|\*))?"
    r"(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn%]",
    # Qt/LibreOffice positional %1 and named %PRODUCTNAME
    r"%\d+",
    r"%[A-Z][A-Z_]{2,}",
    # HTML entities: &amp; &#160; &#x2014;
    r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);",
)
PLACEHOLDER_RE = re.compile("|".join(f"(?:{pattern})" for pattern in _PLACEHOLDER_PATTERNS))
# Every alternative above contains one of these characters (``://`` its colon): text without
# any has no placeholder, and most UI strings are found so in one scan instead of a try of
# every alternative at every position (three times a sentence).
_PLACEHOLDER_CHARS = re.compile(r"[<:@{}$%&]")
# A symbol as it comes back from the model, which may put spaces inside it.
SYMBOL_RE = re.compile(rf"{SYMBOL_OPEN}\s*(\d+)\s*{SYMBOL_CLOSE}")
# A symbol exactly as masking writes it.
EXACT_SYMBOL_RE = re.compile(rf"{SYMBOL_OPEN}\d+{SYMBOL_CLOSE}")
_URL_TRAILING_PUNCTUATION = ".,;:!?)]"


def find_placeholders(text: str) -> list[tuple[int, int]]:
    """Return ``(start, end)`` spans of every placeholder in ``text``, left to right.

    URLs lose trailing sentence punctuation (``see https://x.org.`` keeps the full stop in
    the translatable text).
    """
    spans: list[tuple[int, int]] = []
    if _PLACEHOLDER_CHARS.search(text) is None:
        return spans
    for match in PLACEHOLDER_RE.finditer(text):
        start, end = match.span()
        if "://" in match.group():
            while end > start and text[end - 1] in _URL_TRAILING_PUNCTUATION:
                end -= 1
        spans.append((start, end))
    return spans


def placeholder_strings(text: str) -> list[str]:
    """The placeholder substrings of ``text`` in order (with repeats)."""
    return [text[start:end] for start, end in find_placeholders(text)]


def _mask_with(text: str, index_of: dict[str, int]) -> str:
    """Replace every placeholder whose string has an index; others stay literal."""
    pieces: list[str] = []
    cursor = 0
    for start, end in find_placeholders(text):
        index = index_of.get(text[start:end])
        if index is None:
            continue
        pieces.append(text[cursor:start])
        pieces.append(PLACEHOLDER_SYMBOLS[index])
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)


def _index_by_first_appearance(strings: Iterable[str]) -> dict[str, int]:
    index_of: dict[str, int] = {}
    for string in strings:
        if string not in index_of and len(index_of) < MAX_PLACEHOLDERS:
            index_of[string] = len(index_of)
    return index_of


def protect(text: str) -> tuple[str, list[str]]:
    """Mask placeholders in ``text`` before translation.

    Returns the masked text and ``originals``, where ``originals[k]`` is the span that
    ``｟k｠`` stands for. Text without placeholders comes back unchanged with ``[]``.
    """
    index_of = _index_by_first_appearance(placeholder_strings(text))
    if not index_of:
        return text, []
    return _mask_with(text, index_of), list(index_of)


def restore(masked_translation: str, originals: list[str]) -> str:
    """Put the original spans back in place of the symbols of a translated text.

    Symbols the model invented (an index with no original) are removed rather than shown
    to the user; tolerant of spaces a detokenizer may have put inside the brackets.
    """

    if SYMBOL_OPEN not in masked_translation:
        return masked_translation  # the common case: nothing was masked, nothing invented

    def original_for(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return originals[index] if index < len(originals) else ""

    return SYMBOL_RE.sub(original_for, masked_translation)


def mask_pair(source: str, target: str) -> tuple[str, str, list[str]]:
    """Mask a training pair consistently on both sides.

    The same placeholder string gets the same symbol in source and target, indexed by first
    appearance in the source (as :func:`protect` does at run time). If the two sides do not
    carry the same set of placeholder strings (the translator dropped, added or rewrote
    one: ``%s`` → ``%1$s``), masking would teach the model to lose or invent a symbol, so
    the pair is returned unmasked with ``[]``.
    """
    source_strings = placeholder_strings(source)
    target_strings = placeholder_strings(target)
    if not source_strings and not target_strings:
        return source, target, []
    if set(source_strings) != set(target_strings):
        return source, target, []
    index_of = _index_by_first_appearance(source_strings)
    if len(index_of) < len(set(source_strings)):
        return source, target, []  # more distinct spans than symbols
    return _mask_with(source, index_of), _mask_with(target, index_of), list(index_of)


def surviving_placeholders(source: str, translation: str) -> tuple[int, int]:
    """Count ``(intact, total)`` placeholders of ``source`` found in ``translation``.

    A placeholder occurring n times in the source counts as intact up to the number of
    times it occurs in the translation.
    """
    wanted = Counter(placeholder_strings(source))
    found = Counter(placeholder_strings(translation))
    intact = sum(min(count, found[string]) for string, count in wanted.items())
    return intact, sum(wanted.values())


def survival_rate(sources: Iterable[str], translations: Iterable[str]) -> float:
    """Fraction of source placeholders that come back intact in the translations.

    Returns 1.0 when the sources hold no placeholders at all (nothing could be lost).
    """
    intact_total = 0
    placeholder_total = 0
    for source, translation in zip(sources, translations, strict=True):
        intact, total = surviving_placeholders(source, translation)
        intact_total += intact
        placeholder_total += total
    return intact_total / placeholder_total if placeholder_total else 1.0
