"""Every regular expression that reads a client's text runs in time linear in that text.

Python's ``re`` and ``regex`` backtrack and hold the interpreter lock while they do: one
pattern that rescans a run from each of its characters froze the whole process (``/health``
included) for minutes on one 100,000-letter word. The patterns are collected by looking into
the modules, so a pattern added later is timed too.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import regex

import service.text
import service.translation
import service.web
from service.text.documents import safety
from service.text.documents.markdown import _hard_break
from service.text.glossary import Glossary
from service.text.html import _LINE_BREAK_WHITESPACE
from service.text.placeholders import PLACEHOLDER_RE, find_placeholders
from service.text.segmenter import (
    _FINAL_PUNCTUATION,
    _LINE_BREAKS,
    _SENTENCE_END,
    _SENTENCE_END_ANY_SPACE,
)
from service.text.unspellable import _CURRENCY_AMOUNT

LENGTH = 100_000
# A scan faster than this passes at once; a slower one must grow with the text's length at
# most GROWTH_LIMIT times from a tenth of it (linear: about 10x; quadratic: about 100x).
LIMIT_S = 0.050
GROWTH_LIMIT = 30
_PACKAGES = (service.text, service.translation, service.web)
Pattern = re.Pattern | regex.Pattern


def _modules() -> Iterator[object]:
    for package in _PACKAGES:
        yield package
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            yield importlib.import_module(info.name)


def _module_patterns() -> dict[str, Pattern]:
    found: dict[int, tuple[str, Pattern]] = {}
    for module in _modules():
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern | regex.Pattern):
                found.setdefault(id(value), (f"{module.__name__}.{name}", value))
    return dict(found.values())  # a pattern imported elsewhere is timed once


def _glossary_pattern() -> Pattern:
    """A stored glossary's pattern is built from its entries: one with multi-word terms,
    dotted terms and digits, as a client may send."""
    entries = [("a a", "x"), ("a.b", "y"), ("1 1", "z"), ("%", "p"), ("a", "q"), ("<a", "r")]
    return Glossary.from_entries(entries, max_entries=100)._pattern


PATTERNS = {**_module_patterns(), "Glossary._pattern": _glossary_pattern()}

# Runs of one character, runs of short mixtures, and a prefix that opens a construct followed
# by a long run that never closes it.
_RUNS = list("aA1.0%{}<> \t\n-+@&#$€\u00a0｟!\\['/:,")
_MIXTURES = [
    "a.", "1,", "1.", "1'", "1\u00a0", "a@", "a ", "a-", "{%", "{{", "<a ", "%(", "&#", ". ",
    "${", "$(", "｟1", "<mt-g1", "%1", "{0:", "http://", "<!DOCTYPE", "a1", " \t", "€1", ".)",
]  # fmt: skip
_PREFIXED = [
    ("<a", " "), ("<a b", "="), ("%", "0"), ("%", "1"), ("%(", "a"), ("a@", "b"), ("a@b", ".b"),
    ("€", "1"), ("1", ","), ("{%", "a"), ("{", "a"), ("{a", ":"), ("&", "a"), ("&#", "1"),
    ("｟", "1"), ("｟", " "), ("<!DOCTYPE", " "), ("<?xml", " "), ("http://", "a"),
    ("<mt-g1", " "), ("${", "a"), ("$(", "a"), ("{{", "a"), (".", '"'), ("!", ")"), ("a", " "),
]  # fmt: skip


def _repeat(unit: str, length: int = LENGTH) -> str:
    return (unit * (length // len(unit) + 1))[:length]


INPUTS = [_repeat(unit) for unit in _RUNS + _MIXTURES] + [
    prefix + _repeat(run, LENGTH - len(prefix)) for prefix, run in _PREFIXED
]
# A long run, then one character that ends the construct the run began (kept at every
# length the test cuts the text to): a pattern that looks for the run at the end of the text
# rescans it from each of its characters.
_SUFFIXED = [("a", "@"), (". ", "a"), ("1", "€"), (" ", "\n"), (".", "a"), (" ", "a")]


def _scan_seconds(pattern: Pattern, text: str) -> float:
    """CPU time to find every match: ``subn`` walks the text as ``finditer`` does, in C, on
    this thread. The thread's CPU time, not the wall clock: on a shared machine a long scan is
    preempted where a short one often is not, which would inflate the growth."""
    subject: str | bytes = text.encode() if isinstance(pattern.pattern, bytes) else text
    empty: str | bytes = b"" if isinstance(subject, bytes) else ""
    started = time.thread_time()
    pattern.subn(empty, subject)
    return time.thread_time() - started


def _growth(pattern: Pattern, shorter: str, longer: str, runs: int = 5) -> tuple[float, float]:
    """The best of ``runs`` times of ``pattern`` on each text, taken in turns so that a burst
    of load on a shared machine falls on both alike."""
    shorter_s = longer_s = float("inf")
    for _ in range(runs):
        shorter_s = min(shorter_s, _scan_seconds(pattern, shorter))
        longer_s = min(longer_s, _scan_seconds(pattern, longer))
    return shorter_s, longer_s


def _superlinear(pattern: Pattern, text: str, suffix: str, length: int) -> str | None:
    """Why ``pattern`` is superlinear on the first ``length`` characters of ``text`` (then
    ``suffix``), else None. A scan under ``LIMIT_S`` passes at once; a slower one is judged
    by its growth from a tenth of the text, not by its time: CI machines range from a loaded
    runner to a fast desktop, while the growth is the pattern's own (about 10x for a linear
    pattern, about 100x for one that rescans the run from each of its characters)."""

    def cut(size: int) -> str:
        return text[: size - len(suffix)] + suffix

    longer = cut(length)
    if _scan_seconds(pattern, longer) <= LIMIT_S:
        return None
    shorter_s, longer_s = _growth(pattern, cut(length // 10), longer)
    if longer_s <= LIMIT_S or longer_s <= GROWTH_LIMIT * shorter_s:
        return None
    return (
        f"{longer_s * 1000:.0f} ms on {length:,} characters, "
        f"{longer_s / max(shorter_s, 1e-9):.0f}x its time on {length // 10:,}"
    )


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_takes_linear_time_on_adversarial_input(name: str) -> None:
    pattern = PATTERNS[name]
    for text, suffix in [(text, "") for text in INPUTS] + _SUFFIXED:
        if suffix:
            text = _repeat(text)
        # Shorter prefixes first: a quadratic pattern fails there in well under a second
        # instead of running for minutes on the full length.
        for length in (1_000, 10_000, LENGTH):
            why = _superlinear(pattern, text, suffix, length)
            assert why is None, f"{name} is superlinear: {why}, starting {text[:12]!r}"


def test_the_timing_check_tells_a_rescanning_pattern_from_a_slow_linear_one() -> None:
    """The check itself: ``a*@`` rescans a run of a's from each of them (quadratic); a
    pattern of many alternatives tries each at every character (slow, but linear)."""
    run = _repeat("a")
    assert _superlinear(re.compile("a*@"), run, "", 10_000) is not None
    slow_linear = re.compile("|".join(f"a{index}b" for index in range(100)) + "|a")
    shorter_s, longer_s = _growth(slow_linear, run[: LENGTH // 10], run)
    assert longer_s <= GROWTH_LIMIT * shorter_s, (shorter_s, longer_s)


def test_service_text_compiles_its_patterns_where_the_timing_test_sees_them() -> None:
    """A pattern written inline (``re.sub(r"...", ...)`` inside a function) escapes the test
    above; service/text keeps every pattern as a module-level constant."""
    inline = []
    root = Path(service.text.__file__).parent
    # The glossary's pattern is built from its entries: timed above as Glossary._pattern.
    built_from_data = {root / "glossary.py"}
    for path in sorted(set(root.rglob("*.py")) - built_from_data):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_level = {
            id(node.value) for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("re", "regex")
                and node.args
                and isinstance(node.args[0], ast.Constant | ast.JoinedStr)
                and id(node) not in module_level
            ):
                inline.append(f"{path.name}:{node.lineno}")
    assert not inline, f"patterns compiled inside functions: {inline}"


# --- the rewrites match what the textbook forms matched -----------------------------------

_OLD_NUMBER = r"\d(?:[\d.,'\u00a0\u202f]*\d)?"
_OLD_CURRENCY_AMOUNT = regex.compile(
    rf"\p{{Sc}}[ \u00a0\u202f]?{_OLD_NUMBER}|{_OLD_NUMBER}[ \u00a0\u202f]?\p{{Sc}}"
)
_OLD_LINE_BREAK_WHITESPACE = re.compile(r"[ \t]*[\r\n][\s]*")
_OLD_SENTENCE_END = re.compile(r"([.!?…]+[\"'”’»)\]]*)([ \t\u00a0\u202f]+)")
_OLD_SENTENCE_END_ANY_SPACE = re.compile(r"([.!?…]+[\"'”’»)\]]*)(\s+)")
_OLD_FINAL_PUNCTUATION = re.compile(r"[.!?…:;。！？]*$")
_OLD_LINE_BREAKS = re.compile(r"\s*[\r\n]\s*")
_OLD_DTD = re.compile(rb"<!DOCTYPE[^>\[]*\[|<!ENTITY", re.IGNORECASE)
_OLD_HARD_BREAK = re.compile(r"(\\| {2,})\n[ \t]*")
_OLD_PLACEHOLDER = re.compile(
    "|".join(
        f"(?:{pattern})"
        for pattern in (
            r"</?[A-Za-z][A-Za-z0-9:_.-]*(?:\s+[^<>]*?)?\s*/?>",
            r"(?:https?|ftp)://[^\s<>\"']+",
            r"\{\{[^{}]*\}\}",
            r"\{%.*?%\}",
            r"\{\{|\}\}",
            r"\$\{[^{}\s]*\}",
            r"\$\([A-Za-z0-9_]+\)",
            r"\{[A-Za-z0-9_.\[\]]*(?:![rsa])?(?::[^{}\s]*)?\}",
            r"%(?:\([A-Za-z0-9_.-]+\))?(?:\d+\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
            r"(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn%]",
            r"%\d+",
            r"%[A-Z][A-Z_]{2,}",
            r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);",
        )
    )
)


def _random_texts(alphabet: str, count: int = 20_000, seed: int = 57) -> Iterator[str]:
    generator = random.Random(seed)
    for _ in range(count):
        yield "".join(generator.choice(alphabet) for _ in range(generator.randint(0, 16)))


def _spans(pattern: Pattern, text: str) -> list[tuple[int, int]]:
    return [match.span() for match in pattern.finditer(text)]


def test_currency_amounts_are_the_same_spans_as_before() -> None:
    for text in _random_texts("12,.'\u00a0\u202f €$a"):
        assert _spans(_CURRENCY_AMOUNT, text) == _spans(_OLD_CURRENCY_AMOUNT, text), text


def test_line_breaks_and_sentence_ends_are_the_same_matches_as_before() -> None:
    for text in _random_texts(' \t\r\na.!?)"\u00a0'):
        assert _LINE_BREAK_WHITESPACE.sub("_", text) == _OLD_LINE_BREAK_WHITESPACE.sub("_", text)
        assert [m.groups() for m in _SENTENCE_END.finditer(text)] == [
            m.groups() for m in _OLD_SENTENCE_END.finditer(text)
        ], text


def test_sentences_across_lines_and_final_punctuation_are_found_as_before() -> None:
    """The patterns of ``split_sentences=nonewlines`` and ``preserve_formatting``."""
    for text in _random_texts(' \t\r\n\u2028a.!?…:;)"'):
        assert [m.groups() for m in _SENTENCE_END_ANY_SPACE.finditer(text)] == [
            m.groups() for m in _OLD_SENTENCE_END_ANY_SPACE.finditer(text)
        ], text
        assert _LINE_BREAKS.sub("_", text) == _OLD_LINE_BREAKS.sub("_", text), text
        found = _FINAL_PUNCTUATION.search(text)
        assert found is not None, text
        assert found.span() == _OLD_FINAL_PUNCTUATION.search(text).span(), text  # type: ignore[union-attr]


def test_internal_subsets_are_found_as_before() -> None:
    pieces = ["<!DOCTYPE", "<!doctype", " x", "[", ">", "<", "<!ENTITY", "]"]
    generator = random.Random(57)
    for _ in range(5_000):
        data = "".join(generator.choice(pieces) for _ in range(generator.randint(0, 8))).encode()
        assert bool(safety._DTD_RE.search(data)) == bool(_OLD_DTD.search(data)), data


def test_hard_breaks_are_found_as_before() -> None:
    for text in _random_texts("  \\\n\ta"):
        for cursor in range(len(text) + 1):
            old = _OLD_HARD_BREAK.search(text, cursor)
            expected = (old.start(), old.end(), old.group(1)) if old else None
            assert _hard_break(text, cursor) == expected, (text, cursor)


def test_placeholders_other_than_addresses_are_the_same_spans_as_before() -> None:
    """Tags and template tags are rewritten exactly, except that a ``{%`` tag no longer spans
    another ``{%`` (tags do not nest); e-mail addresses have their own test."""
    for text in _random_texts('<a b/>"%{}()$s1.:!&#;x '):
        if text.count("{%") > 1:
            continue
        assert _spans(PLACEHOLDER_RE, text) == _spans(_OLD_PLACEHOLDER, text), text


@pytest.mark.parametrize(
    ("text", "addresses"),
    [
        ("Mail a.b@example.com now", ["a.b@example.com"]),
        ("<b>x@y.org</b>", ["x@y.org"]),
        ("to:first_last+tag@mail.example.co.uk.", ["first_last+tag@mail.example.co.uk"]),
        ("a@b.c and d@e.f", ["a@b.c", "d@e.f"]),
        ("no address @ here.", []),
    ],
)
def test_e_mail_addresses_are_found_in_ordinary_text(text: str, addresses: list[str]) -> None:
    assert [text[s:e] for s, e in find_placeholders(text) if "@" in text[s:e]] == addresses
