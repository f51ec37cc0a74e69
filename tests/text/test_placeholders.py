"""Placeholder protection: what the model must never be allowed to garble."""

import pytest

from service.text.placeholders import (
    MAX_PLACEHOLDERS,
    PLACEHOLDER_SYMBOLS,
    mask_pair,
    placeholder_strings,
    protect,
    restore,
    survival_rate,
    surviving_placeholders,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello %s, %d new", ["%s", "%d"]),
        (
            "%(name)s and %1$s cost %.2f (%-10s, %lu, %%)",
            ["%(name)s", "%1$s", "%.2f", "%-10s", "%lu", "%%"],
        ),
        ("{0} of {name} {0:.2f} {}", ["{0}", "{name}", "{0:.2f}", "{}"]),
        ("literal {{ and }} braces", ["{{ and }}"]),
        ("use {{ alone", ["{{"]),
        ("path ${HOME} and $(ARG1)", ["${HOME}", "$(ARG1)"]),
        (
            '<b>bold</b><br/><a href="https://x.org/?a=1&amp;b=2">x</a>',
            ["<b>", "</b>", "<br/>", '<a href="https://x.org/?a=1&amp;b=2">', "</a>"],
        ),
        ("Tom &amp; Jerry &#160; &#x2014;", ["&amp;", "&#160;", "&#x2014;"]),
        (
            "See https://example.org/docs. Mail a.b@example.com",
            ["https://example.org/docs", "a.b@example.com"],
        ),
        ("%PRODUCTNAME needs %1", ["%PRODUCTNAME", "%1"]),
    ],
)
def test_finds_each_kind_of_placeholder(text: str, expected: list[str]) -> None:
    assert placeholder_strings(text) == expected


@pytest.mark.parametrize("text", ["50% discount", "100 % sure", "Tom & Jerry", "a < b > c", "R&D"])
def test_ordinary_symbols_are_not_placeholders(text: str) -> None:
    assert placeholder_strings(text) == []


def test_text_without_placeholders_is_untouched() -> None:
    assert protect("Save the file?") == ("Save the file?", [])
    assert restore("Datei speichern?", []) == "Datei speichern?"


def test_protect_indexes_by_first_appearance_and_shares_identical_strings() -> None:
    masked, originals = protect("%s of %d, again %s")
    assert masked == "｟0｠ of ｟1｠, again ｟0｠"
    assert originals == ["%s", "%d"]


@pytest.mark.parametrize(
    "text",
    [
        "Deleted %(count)d files from <b>%(folder)s</b>.",
        '<a href="{url}">{name}</a>&nbsp;%s',
        "adjacent%s%d{0}<i></i>",
        'nested <span title="%s">x</span>',
        "${a}${b}${a}",
    ],
)
def test_protect_then_restore_is_identity(text: str) -> None:
    masked, originals = protect(text)
    assert originals, "every example holds placeholders"
    assert not placeholder_strings(masked)
    assert restore(masked, originals) == text


def test_restore_follows_the_translation_order() -> None:
    masked, originals = protect("Copy %(src)s to %(dst)s")
    translated = masked.replace("Copy ｟0｠ to ｟1｠", "｟1｠: ｟0｠ kopieren")
    assert restore(translated, originals) == "%(dst)s: %(src)s kopieren"


def test_restore_drops_invented_symbols_and_tolerates_spaces_inside() -> None:
    assert restore("a ｟ 0 ｠ b ｟7｠", ["%s"]) == "a %s b "


def test_more_distinct_placeholders_than_symbols_leaves_the_rest_literal() -> None:
    text = " ".join(f"{{p{i}}}" for i in range(MAX_PLACEHOLDERS + 2))
    masked, originals = protect(text)
    assert len(originals) == MAX_PLACEHOLDERS
    assert masked.endswith(f"{{p{MAX_PLACEHOLDERS}}} {{p{MAX_PLACEHOLDERS + 1}}}")
    assert restore(masked, originals) == text


def test_mask_pair_uses_the_same_symbol_for_the_same_string_on_both_sides() -> None:
    source, target, originals = mask_pair(
        "Delete %s files <b>now</b>", "<b>Jetzt</b> %s Dateien löschen"
    )
    assert source == "Delete ｟0｠ files ｟1｠now｟2｠"
    assert target == "｟1｠Jetzt｟2｠ ｟0｠ Dateien löschen"
    assert originals == ["%s", "<b>", "</b>"]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("Delete %s files", "%1$s Dateien löschen"),  # rewritten
        ("Delete %s files", "Dateien löschen"),  # dropped
        ("Delete files", "Dateien <b>löschen</b>"),  # added
    ],
)
def test_mask_pair_leaves_unmatched_pairs_unmasked(source: str, target: str) -> None:
    assert mask_pair(source, target) == (source, target, [])


def test_symbols_are_distinct_and_contain_no_whitespace() -> None:
    assert len(set(PLACEHOLDER_SYMBOLS)) == MAX_PLACEHOLDERS
    assert PLACEHOLDER_SYMBOLS[0] == "｟0｠"
    assert all(not any(c.isspace() for c in symbol) for symbol in PLACEHOLDER_SYMBOLS)


def test_survival_counts_each_occurrence() -> None:
    assert surviving_placeholders("%s and %s of %d", "%s und %d") == (2, 3)
    assert survival_rate(["%s <b>x</b>", "plain"], ["%s <b>x</b>", "schlicht"]) == 1.0
    assert survival_rate(["%s", "{0}"], ["% s", "{0}"]) == 0.5
    assert survival_rate(["plain"], ["schlicht"]) == 1.0


def test_a_word_glued_to_a_documents_formatting_boundary_reaches_the_model_as_a_word() -> None:
    from service.text.protection import space_out_formatting, tighten

    masked, originals = protect("Delete <mt-g1>all</mt-g1> files? <b>Save</b>")
    spaced, glued = space_out_formatting(masked, originals)
    # The document's boundaries get a space (the word keeps its word start for the
    # tokenizer); HTML markup a UI string carries is left as the model knows it.
    assert spaced == "Delete ｟0｠ all ｟1｠ files? ｟2｠Save｟3｠"
    assert sorted(glued) == [(0, "right"), (1, "left")]
    # The spaces go again, wherever the model put the symbols.
    translated = tighten("｟0｠ alle ｟ 1 ｠ Dateien löschen? ｟2｠Speichern｟3｠", glued)
    assert restore(translated, originals) == (
        "<mt-g1>alle</mt-g1> Dateien löschen? <b>Speichern</b>"
    )
