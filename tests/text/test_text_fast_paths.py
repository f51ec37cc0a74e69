"""The text stage's short cuts for plain strings (most UI strings: ASCII, nothing to protect)
skip the scans that cannot find anything, and give what the scans give.

Against the shipped default model's tokenizer. The scans are replaced by objects that fail
when used, so a test fails where a short cut does not hold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.text import placeholders, unspellable
from service.text.limits import DecodingOptions, TextLimits
from service.text.pipeline import TextPipeline, copy_tokens_for
from service.text.placeholders import PLACEHOLDER_SYMBOLS, find_placeholders, restore
from service.text.protection import RunProtector, restore_every_run, space_out_formatting
from service.text.tokenizer import Tokenizer

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "default"
GREEDY = DecodingOptions(beam_size=1, max_new_tokens=None, length_penalty=1.0)


class Unusable:
    """Stands in for a compiled pattern that must not be used."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the pattern was used ({name})")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(DEFAULT_MODEL)


@pytest.fixture()
def no_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placeholders, "PLACEHOLDER_RE", Unusable())
    monkeypatch.setattr(unspellable, "_GRAPHEME", Unusable())
    monkeypatch.setattr(unspellable, "_LONE_LETTER", Unusable())


def test_a_plain_ascii_string_is_planned_without_the_placeholder_grapheme_and_letter_scans(
    tokenizer: Tokenizer, no_scans: None
) -> None:
    pipeline = TextPipeline(tokenizer, TextLimits(), "en")
    plans = pipeline.plan(["Save changes. Open the file?"], GREEDY)
    sentences = plans[0].sentences
    assert [s.masked for s in sentences] == ["Save changes.", "Open the file?"]
    assert all(s.originals == [] and s.src_ids for s in sentences)
    pipeline.finish(sentences[0], list(sentences[0].src_ids))
    assert sentences[0].translation == "Save changes."


@pytest.mark.parametrize(
    "text, runs",
    [
        ("a + b = c", ["+", "="]),  # ASCII symbols (category S) are protected
        ("Press ^ or | now", ["^", "|"]),
        ("line one\r\nline two", []),  # CRLF is one cluster, whitespace
        ("Ctrl+S saves", ["+"]),
        ("Save changes", []),
    ],
)
def test_ascii_text_is_judged_character_by_character_as_by_clusters(
    tokenizer: Tokenizer, text: str, runs: list[str]
) -> None:
    protector = RunProtector(tokenizer)
    found = [text[start:end] for start, end in protector.unspellable.runs(text)]
    assert found == runs


def test_text_with_a_placeholder_character_is_still_scanned() -> None:
    assert find_placeholders("Save %s changes to {name}") == [(5, 7), (19, 25)]
    assert find_placeholders("see https://x.org.") == [(4, 17)]
    assert find_placeholders("Save changes") == []


def test_restoring_without_symbols_returns_the_translation_and_drops_invented_ones() -> None:
    assert restore("Änderungen speichern", []) == "Änderungen speichern"
    assert restore(f"Änderungen {PLACEHOLDER_SYMBOLS[3]}speichern", []) == "Änderungen speichern"
    assert restore_every_run("Speichern", [], "Save") == "Speichern"
    assert restore_every_run("", [], "Save") == ""
    assert (
        restore_every_run("Speichern", ["%s"], f"Save {PLACEHOLDER_SYMBOLS[0]}") == "Speichern %s"
    )
    assert space_out_formatting("Save all", []) == ("Save all", ())


def test_a_source_without_symbols_may_invent_none(tokenizer: Tokenizer) -> None:
    pipeline = TextPipeline(tokenizer, TextLimits(), "en")
    symbols = pipeline.symbol_ids
    words = [token for token in range(100, 110) if token not in symbols]
    plain = copy_tokens_for([*words, tokenizer.eos_id], symbols)
    assert plain == {token: 0 for token in symbols}
    first = min(symbols)
    counted = copy_tokens_for([first, words[0], first, tokenizer.eos_id], symbols)
    assert counted is not None and counted[first] == 2
    assert sum(counted.values()) == 2
