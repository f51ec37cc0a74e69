"""File translation (service/text/files.py), each format read and written by its library,
with the same upper-casing stand-in translator as tests/text/test_html_text.py."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import polib
import pytest
import srt

from service.text.files import UnsupportedFile, translate_file
from tests.text.test_html_text import shout

POT = r"""# Template.
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\n"
"POT-Creation-Date: 2026-11-23 10:00+0000\n"
"PO-Revision-Date: YEAR-MO-DA HO:MI+ZONE\n"
"Last-Translator: FULL NAME <EMAIL@ADDRESS>\n"
"Language-Team: LANGUAGE <LL@li.org>\n"
"Language: \n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"

#: app.py:10
#, python-format
msgid "Saved %(count)d files to %s"
msgstr ""

#: app.py:12
msgctxt "menu"
msgid "Open"
msgstr ""

#: app.py:14
#, python-brace-format
msgid "One file"
msgid_plural "{n} files"
msgstr[0] ""
msgstr[1] ""

#: app.py:20
msgid "Already done"
msgstr "Schon erledigt"
"""


def run(filename: str, content: bytes, target: str = "de"):
    return asyncio.run(translate_file(filename, content, target, shout))


def test_po_template_gets_fuzzy_msgstrs_with_plurals_flags_and_placeholders():
    result = run("demo.pot", POT.encode())
    assert result.filename == "demo.po" and result.texts == 4
    catalog = polib.pofile(result.content.decode())
    saved = catalog.find("Saved %(count)d files to %s")
    assert saved.msgstr == "SAVED %(count)d FILES TO %s"
    assert saved.flags == ["fuzzy", "python-format"]
    menu = catalog.find("Open", msgctxt="menu")
    assert menu.msgstr == "OPEN" and "fuzzy" in menu.flags
    plural = catalog.find("One file")
    assert plural.msgstr_plural == {0: "ONE FILE", 1: "{n} FILES"}
    assert plural.flags == ["fuzzy", "python-brace-format"]
    done = catalog.find("Already done")
    assert done.msgstr == "Schon erledigt" and "fuzzy" not in done.flags
    assert catalog.metadata["Language"] == "de"
    assert catalog.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert "charset=UTF-8" in catalog.metadata["Content-Type"]


def test_po_plural_forms_follow_the_target_language():
    catalog = polib.pofile(run("demo.pot", POT.encode(), target="pl").content.decode())
    assert len(catalog.find("One file").msgstr_plural) == 3


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="gettext's msgfmt is not installed")
def test_translated_po_passes_msgfmt_check(tmp_path):
    path = tmp_path / "demo.po"
    path.write_bytes(run("demo.pot", POT.encode()).content)
    # --use-fuzzy: our entries are fuzzy, and msgfmt checks only entries it would compile.
    checked = subprocess.run(
        ["msgfmt", "--check", "--use-fuzzy", "-o", "/dev/null", str(path)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


def test_srt_keeps_timings_and_indices_and_wraps_into_the_same_line_count():
    source = (
        "1\n00:00:01,000 --> 00:00:02,500\nHello there,\nmy friend.\n\n"
        "2\n00:00:03,000 --> 00:00:04,000\n<i>Save</i> the file!\n\n"
    )
    result = run("movie.srt", source.encode())
    subtitles = list(srt.parse(result.content.decode()))
    original = list(srt.parse(source))
    assert [(s.index, s.start, s.end) for s in subtitles] == [
        (s.index, s.start, s.end) for s in original
    ]
    assert subtitles[0].content.split("\n") == ["HELLO THERE,", "MY FRIEND."]
    assert subtitles[1].content == "<i>SAVE</i> THE FILE!"
    assert result.texts == 2


def test_txt_translates_each_line_and_keeps_line_endings_and_blank_lines():
    source = "First line.\r\n\r\nSecond line, %s.\n   \nlast"
    result = run("notes.txt", source.encode("utf-8-sig"))
    assert result.content.decode() == "FIRST LINE.\r\n\r\nSECOND LINE, %s.\n   \nLAST"
    assert result.texts == 3


def test_html_file_uses_the_html_translation():
    result = run("page.html", b"<html><body><p>Hi <b>you</b></p><pre>x</pre></body></html>")
    assert result.content == b"<html><body><p>HI <b>YOU</b></p><pre>x</pre></body></html>"


@pytest.mark.parametrize(
    ("filename", "content", "says"),
    [
        ("report.pdf", b"%PDF", "not supported"),
        ("latin1.txt", "Grüße".encode("latin-1"), "not UTF-8"),
        ("broken.srt", b"1\nnot a timing\nHello\n", "not valid SubRip"),
    ],
)
def test_unsupported_or_unreadable_files_are_refused(filename, content, says):
    with pytest.raises(UnsupportedFile, match=says):
        run(filename, content)
