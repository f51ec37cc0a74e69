"""HTML translation (service/text/html.py) with a stand-in translator that upper-cases the words
and, like the service, masks markup and entities as placeholders first; so what is upper-case
in the output went to the translator, and what is not, did not."""

from __future__ import annotations

import asyncio

import pytest

from service.text.html import parse_html, translate_html
from service.text.placeholders import protect, restore


async def shout(texts: list[str]) -> list[str]:
    out = []
    for text in texts:
        masked, originals = protect(text)
        out.append(restore(masked.upper(), originals))
    return out


def translated(html: str) -> str:
    return asyncio.run(translate_html(html, shout))


def test_text_between_tags_is_translated_and_tags_attributes_entities_kept():
    html = '<div class="Box" title="Keep this">Hello <a href="/Path?a=1&amp;b">world</a> &amp; you&#33;</div>'
    assert translated(html) == (
        '<div class="Box" title="Keep this">HELLO <a href="/Path?a=1&amp;b">WORLD</a> &amp; YOU&#33;</div>'
    )


def test_inline_markup_goes_to_the_translator_inside_its_sentence():
    assert parse_html("<p>Click <b>Save</b> to keep it.</p>").texts() == [
        "Click <b>Save</b> to keep it."
    ]


def test_block_elements_and_line_breaks_separate_texts():
    html = "<ul><li>First item</li><li>Second item</li></ul><p>One<br>Two</p>"
    assert parse_html(html).texts() == ["First item", "Second item", "One", "Two"]
    assert translated(html) == "<ul><li>FIRST ITEM</li><li>SECOND ITEM</li></ul><p>ONE<br>TWO</p>"


@pytest.mark.parametrize(
    "kept",
    [
        "<script>var label = 'Save <b>now</b>';</script>",
        "<style>p { content: 'Save'; }</style>",
        "<pre>Keep   this\n  as it is</pre>",
        '<p translate="no">Brand Name</p>',
        '<div class="box notranslate">Brand Name</div>',
        "<textarea>typed text</textarea>",
    ],
)
def test_untranslatable_elements_pass_through_byte_for_byte(kept):
    assert translated(f"<p>before</p>{kept}<p>after</p>") == f"<p>BEFORE</p>{kept}<p>AFTER</p>"


def test_inline_code_stays_in_place_inside_its_translated_sentence():
    html = '<p>Run <code>ls -l</code> and <span translate="no">MyApp</span> starts.</p>'
    assert parse_html(html).texts() == ["Run <mt-keep-0/> and <mt-keep-1/> starts."]
    assert translated(html) == (
        '<p>RUN <code>ls -l</code> AND <span translate="no">MyApp</span> STARTS.</p>'
    )


def test_nested_skipped_elements_end_at_their_own_closing_tag():
    html = "<pre>a <pre>b</pre> c</pre><p>text</p>"
    assert translated(html) == "<pre>a <pre>b</pre> c</pre><p>TEXT</p>"


def test_comments_doctype_and_whitespace_only_nodes_are_kept():
    html = "<!DOCTYPE html>\n<html>\n  <!-- a comment -->\n  <body><h1>Title</h1></body>\n</html>\n"
    assert translated(html) == html.replace("Title", "TITLE")


def test_line_breaks_inside_a_paragraph_become_one_space_so_the_sentence_stays_whole():
    assert parse_html("<p>A sentence that\n   runs on.</p>").texts() == ["A sentence that runs on."]


def test_an_identity_translation_gives_the_source_back_exactly():
    async def same(texts: list[str]) -> list[str]:
        return texts

    html = '<p class="x">Hi <i>there</i>, &lt;you&gt;.</p><br/><img src="a.png" alt="An image">'
    assert asyncio.run(translate_html(html, same)) == html


def test_broken_markup_is_read_leniently():
    html = "<p>Unclosed <b>bold<p>Next & loose ampersand"
    assert translated(html) == "<p>UNCLOSED <b>BOLD<p>NEXT & LOOSE AMPERSAND"


def test_fragment_without_text_is_not_sent_to_the_translator():
    async def never(texts: list[str]) -> list[str]:
        raise AssertionError(f"called with {texts}")

    html = '<div><img src="x.png"><br/> &nbsp; </div>'
    assert asyncio.run(translate_html(html, never)) == html


@pytest.mark.parametrize("html", ["", "   ", "\n"])
def test_empty_or_blank_html_comes_back_unchanged(html):
    assert translated(html) == html
    assert parse_html(html).units == []


def test_deepls_tag_rules_decide_what_splits_and_what_is_kept():
    from service.text.html import MarkupRules

    xml = "<doc><par>Open the <x>file</x> now.</par><par>Press <k>Ctrl</k> and S.</par></doc>"
    assert parse_html(xml).texts() == ["Open the", "file", "now.", "Press", "Ctrl", "and S."]
    rules = MarkupRules(ignore=frozenset({"k"}), non_splitting=frozenset({"x"}))
    assert parse_html(xml, rules).texts() == [
        "Open the <x>file</x> now.",
        "Press <mt-keep-0/> and S.",
    ]
    manual = MarkupRules(splitting=frozenset({"par"}), outline_detection=False)
    assert parse_html(xml, manual).texts() == [
        "Open the <x>file</x> now.",
        "Press <k>Ctrl</k> and S.",
    ]
    assert parse_html("<p>Open <b>it</b></p>", MarkupRules(splitting=frozenset({"b"}))).texts() == [
        "Open",
        "it",
    ]
