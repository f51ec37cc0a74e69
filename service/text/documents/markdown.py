"""Markdown: the text of paragraphs, headings, list items, block quotes and table cells
translated; code, link targets, images and HTML kept as written.

markdown-it-py (CommonMark, with tables) finds the blocks and, inside each, the inline
constructs; the source itself is edited, not re-rendered, so everything the translation does
not touch comes back byte for byte (fenced and indented code, HTML blocks, front matter-like
lines, blank lines, list markers, the exact emphasis characters).

Inside a block the raw source goes to the translator with its markup protected like the
HTML path's inline tags: emphasis, strong, strikethrough and a link's text are tags the
model moves with their words (``<mt-g1>…</mt-g1>``, the delimiters and the link's
``](target "title")`` put back around them); inline code, images, autolinks, inline HTML and
hard breaks are opaque placeholders (``<mt-x2/>``) copied back whole. A paragraph that spans
several source lines comes back on one line (its soft line breaks are spaces): the
rendering is the same, and the model sees a sentence, not line fragments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

from service.text.bulk import TranslateTexts

_TOKEN_RE = re.compile(r"<(/?)mt-([gx])(\d+)\s*/?>")
_PAIRED = {"strong_open": "strong_close", "em_open": "em_close", "s_open": "s_close"}
_LIST_MARKER = re.compile(r"[-*+]|\d{1,9}[.)]")
# A soft line break with the spaces around it; the spaces before it are read from the first
# of them (a match ends past the spaces after), so a long run of spaces is read once.
_SOFT_BREAK = re.compile(r"(?<![ \t])[ \t]*+\n[ \t]*+")
_LINE_END = re.compile(r"\n[ \t]*+")


@dataclass
class _Inline:
    """One block's inline source: where it is, its text for the translator, its markup."""

    first_line: int
    line_count: int
    raw: str  # the inline source as markdown-it gives it (container prefixes stripped)
    text: str = ""
    paired: dict[int, tuple[str, str]] = field(default_factory=dict)  # number → (open, close)
    opaque: dict[int, str] = field(default_factory=dict)


def _closing_bracket_end(raw: str, start: int) -> int:
    """After a link's text (``raw[start] == "]"``): the end of ``](target)``, ``][ref]`` or
    just ``]``."""
    after = start + 1
    if raw.startswith("(", after):
        depth = 0
        for index in range(after, len(raw)):
            if raw[index] == "\\":
                continue
            if raw[index] == "(":
                depth += 1
            elif raw[index] == ")":
                depth -= 1
                if depth == 0:
                    return index + 1
    if raw.startswith("[", after) and (end := raw.find("]", after)) != -1:
        return end + 1
    return after


def _hard_break(raw: str, cursor: int) -> tuple[int, int, str] | None:
    """``(start, end, marker)`` of the first hard break at or after ``cursor``: a backslash or
    two or more spaces, then a line break and the next line's indent. Found from the line
    breaks, each space run read once, so a long run of spaces costs its length, not its
    square."""
    for line_end in _LINE_END.finditer(raw, cursor):
        newline = line_end.start()
        if newline > cursor and raw[newline - 1] == "\\":
            return newline - 1, line_end.end(), "\\"
        start = newline
        while start > cursor and raw[start - 1] == " ":
            start -= 1
        if newline - start >= 2:
            return start, line_end.end(), raw[start:newline]
    return None


def _protect(inline: _Inline, children: list[Token]) -> None:
    """Fill ``inline.text`` and its markup tables from the inline tokens."""
    raw, pieces, cursor, number = inline.raw, [], 0, 0
    open_numbers: list[int] = []
    index = 0

    def emit_until(position: int) -> None:
        nonlocal cursor
        pieces.append(_SOFT_BREAK.sub(" ", raw[cursor:position]))
        cursor = position

    def opaque(start: int, end: int) -> None:
        nonlocal cursor, number
        if start < cursor:
            return  # not found where expected: the markup stays in the text
        emit_until(start)
        number += 1
        inline.opaque[number] = raw[start:end]
        pieces.append(f"<mt-x{number}/>")
        cursor = end

    while index < len(children):
        child = children[index]
        kind = child.type
        if kind == "code_inline":
            start = raw.find(child.markup, cursor)
            end = raw.find(child.markup, start + len(child.markup))
            if start != -1 and end != -1:
                opaque(start, end + len(child.markup))
        elif kind in ("image", "html_inline") or (
            kind == "link_open" and child.markup == "autolink"
        ):
            opener = {"image": "![", "html_inline": child.content}.get(kind, "<")
            start = raw.find(opener, cursor)
            if start != -1:
                if kind == "image":
                    end = _closing_bracket_end(raw, raw.find("]", start))
                elif kind == "html_inline":
                    end = start + len(child.content)
                else:
                    end = raw.find(">", start) + 1
                opaque(start, end)
            if kind == "link_open":
                while index < len(children) and children[index].type != "link_close":
                    index += 1
        elif kind == "hardbreak":
            hard_break = _hard_break(raw, cursor)
            if hard_break:
                start, end, marker = hard_break
                opaque(start, end)
                inline.opaque[number] = marker + "\n"  # the indent is the block's
        elif kind in _PAIRED or kind == "link_open":
            marker = "[" if kind == "link_open" else child.markup
            start = raw.find(marker, cursor)
            if start != -1:
                emit_until(start)
                number += 1
                inline.paired[number] = (marker, "")
                open_numbers.append(number)
                pieces.append(f"<mt-g{number}>")
                cursor = start + len(marker)
        elif (kind in _PAIRED.values() or kind == "link_close") and open_numbers:
            opened = open_numbers.pop()
            marker = inline.paired[opened][0]
            if kind == "link_close":
                start = raw.find("]", cursor)
                end = _closing_bracket_end(raw, start) if start != -1 else -1
            else:
                start = raw.find(marker, cursor)
                end = start + len(marker)
            if start != -1:
                emit_until(start)
                inline.paired[opened] = (marker, raw[start:end])
                pieces.append(f"</mt-g{opened}>")
                cursor = end
        index += 1
    emit_until(len(raw))
    inline.text = "".join(pieces)


def _restore(inline: _Inline, translation: str) -> str:
    out, cursor, used = [], 0, set()
    for match in _TOKEN_RE.finditer(translation):
        out.append(translation[cursor : match.start()])
        cursor = match.end()
        closing, kind, number = match.group(1), match.group(2), int(match.group(3))
        if kind == "x" and number in inline.opaque and number not in used:
            out.append(inline.opaque[number])
            used.add(number)
        elif kind == "g" and number in inline.paired:
            out.append(inline.paired[number][1 if closing else 0])
    out.append(translation[cursor:])
    # An opaque piece the translation lost (code, an image) is put at the end, not dropped.
    out += [piece for number, piece in inline.opaque.items() if number not in used]
    return "".join(out)


def _inlines(tokens: list[Token]) -> list[_Inline]:
    found: list[_Inline] = []
    line_map: list[int] | None = None
    for token in tokens:
        if token.map is not None and token.type != "inline":
            line_map = token.map
        if token.type != "inline" or not token.content.strip() or line_map is None:
            continue
        if not any(char.isalpha() for char in token.content):
            continue
        lines = token.content.count("\n") + 1
        inline = _Inline(line_map[0], lines, token.content)
        _protect(inline, token.children or [])
        found.append(inline)
    return found


async def translate_markdown(source: str, translate_texts: TranslateTexts) -> tuple[str, int]:
    """The translated Markdown and how many texts went to the translator."""
    parser = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    inlines = _inlines(parser.parse(source))
    if not inlines:
        return source, 0
    translations = await translate_texts([inline.text for inline in inlines])
    lines = source.splitlines(keepends=True)
    cursors: dict[int, int] = {}  # per line: where the next cell's text is looked for
    deleted: set[int] = set()
    for inline, translation in zip(inlines, translations, strict=True):
        content_lines = inline.raw.split("\n")
        # Table cells share a row's line: find this block's line from the map onwards.
        row = inline.first_line
        first = content_lines[0].strip()
        while row < len(lines) and first not in lines[row][cursors.get(row, 0) :]:
            row += 1
        if row >= len(lines):
            continue  # not found as written (it should be): left untranslated
        line = lines[row]
        start = line.index(first, cursors.get(row, 0))
        prefix = line[:start]
        text = _restore(inline, translation)
        if "\n" in text:  # a hard break: later lines keep the block's indentation
            indent = _LIST_MARKER.sub(lambda m: " " * len(m.group()), prefix)
            text = text.replace("\n", "\n" + indent)
        if len(content_lines) == 1:
            end = start + len(first)
            lines[row] = prefix + text + line[end:]
            cursors[row] = len(prefix) + len(text)
            continue
        last = content_lines[-1].strip()
        last_row = row + len(content_lines) - 1
        ending = lines[last_row]
        suffix = ending[ending.rfind(last) + len(last) :] if last in ending else "\n"
        lines[row] = prefix + text + suffix
        deleted.update(range(row + 1, last_row + 1))
    return "".join(line for index, line in enumerate(lines) if index not in deleted), len(inlines)
