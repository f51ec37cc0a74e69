"""OpenDocument: text (.odt), presentations (.odp) and spreadsheets (.ods).

ODF keeps text in the paragraph itself and in inline elements (``text:span`` with a style,
``text:a`` with a link), so a slot is an element's ``text`` or a child's ``tail``, keyed by
the chain of inline elements around it. What is translated:

* **odt / odp**: every ``text:p`` and ``text:h`` of ``content.xml`` (body, tables, frames and
  text boxes, footnotes and endnotes, comments, speaker notes) and the headers and footers of
  the master pages in ``styles.xml`` (not the rest of it: master slides' prompt texts); a
  presentation's declared header and footer texts (``presentation:footer-decl``).
* **ods**: paragraphs of string cells and of comments on sheets that are shown; cells with a
  formula, numbers, dates, and sheets whose table style hides them are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator

from lxml import etree

from service.errors import UnsupportedFile
from service.text.documents.inline import Slot, Unit
from service.text.documents.ooxml import Parts

TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
PRESENTATION = "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"

_PARAGRAPHS = (f"{{{TEXT}}}p", f"{{{TEXT}}}h")
# Inline elements a sentence runs through: styled spans, links, metadata, ruby bases.
_INLINE = frozenset(f"{{{TEXT}}}{name}" for name in ["span", "a", "meta", "ruby", "ruby-base"])
# Marks of no width: a sentence goes on through them.
_ZERO_WIDTH = frozenset(
    f"{{{TEXT}}}{name}"
    for name in [
        "bookmark",
        "bookmark-start",
        "bookmark-end",
        "soft-page-break",
        "reference-mark",
        "reference-mark-start",
        "reference-mark-end",
        "change",
        "change-start",
        "change-end",
        "toc-mark",
        "toc-mark-start",
        "toc-mark-end",
        "alphabetical-index-mark",
        "alphabetical-index-mark-start",
        "alphabetical-index-mark-end",
    ]
) | {f"{{{OFFICE}}}annotation-end"}
_HEADERS_FOOTERS = frozenset(
    f"{{{STYLE}}}{name}"
    for name in ["header", "footer", "header-left", "footer-left", "header-first", "footer-first"]
)


def paragraph_units(paragraph: etree._Element) -> list[Unit]:
    units = [Unit()]

    def boundary() -> None:
        if units[-1].slots:
            units.append(Unit())

    def walk(node: etree._Element, chain: tuple) -> None:
        units[-1].slots.append(Slot(node, "text", chain, not chain))
        for child in node:
            if child.tag in _INLINE:
                walk(child, (*chain, (child.tag, tuple(sorted(child.attrib.items())))))
            elif child.tag not in _ZERO_WIDTH:
                boundary()  # a tab, line break, spaces, field, note, frame or comment
            units[-1].slots.append(Slot(child, "tail", chain, not chain))

    walk(paragraph, ())
    return [unit for unit in units if unit.has_text()]


def _units(parts: Parts, name: str, paragraphs) -> Iterator[Unit]:
    found = [unit for paragraph in paragraphs for unit in paragraph_units(paragraph)]
    if found:
        parts.changed.add(name)
    yield from found


def _all_paragraphs(root: etree._Element) -> Iterator[etree._Element]:
    return (element for element in root.iter(*_PARAGRAPHS))


def _text_document_units(parts: Parts, kind: str) -> Iterator[Unit]:
    if "content.xml" not in parts.archive.data:
        raise UnsupportedFile(f"the {kind} file is corrupt (content.xml is missing)")
    yield from _units(parts, "content.xml", _all_paragraphs(parts.tree("content.xml").getroot()))
    if "styles.xml" in parts.archive.data:
        root = parts.tree("styles.xml").getroot()
        paragraphs = [
            paragraph
            for region in root.iter(*_HEADERS_FOOTERS)
            for paragraph in region.iter(*_PARAGRAPHS)
        ]
        yield from _units(parts, "styles.xml", paragraphs)


def odt_units(parts: Parts) -> Iterator[Unit]:
    return _text_document_units(parts, "odt")


def odp_units(parts: Parts) -> Iterator[Unit]:
    yield from _text_document_units(parts, "odp")
    # A presentation's footer and header texts are declared once in content.xml and shown
    # on every slide whose master has the field.
    root = parts.tree("content.xml").getroot()
    declarations = root.iter(*(f"{{{PRESENTATION}}}{n}-decl" for n in ("header", "footer")))
    yield from _units(parts, "content.xml", list(declarations))


def ods_units(parts: Parts) -> Iterator[Unit]:
    if "content.xml" not in parts.archive.data:
        raise UnsupportedFile("the ods file is corrupt (content.xml is missing)")
    root = parts.tree("content.xml").getroot()
    hidden_styles = {
        style.get(f"{{{STYLE}}}name")
        for style in root.iter(f"{{{STYLE}}}style")
        if any(
            props.get(f"{{{TABLE}}}display") == "false"
            for props in style.iter(f"{{{STYLE}}}table-properties")
        )
    }
    paragraphs = []
    for table in root.iter(f"{{{TABLE}}}table"):
        if table.get(f"{{{TABLE}}}style-name") in hidden_styles:
            continue
        for cell in table.iter(f"{{{TABLE}}}table-cell"):
            value_type = cell.get(f"{{{OFFICE}}}value-type")
            is_text = value_type in (None, "string") and cell.get(f"{{{TABLE}}}formula") is None
            for paragraph in cell.iter(*_PARAGRAPHS):
                in_comment = any(
                    a.tag == f"{{{OFFICE}}}annotation" for a in paragraph.iterancestors()
                )
                if is_text or in_comment:
                    paragraphs.append(paragraph)
    # A table inside a cell is walked from both tables: each paragraph is taken once.
    yield from _units(parts, "content.xml", list(dict.fromkeys(paragraphs)))
