"""Office Open XML: Word (.docx), PowerPoint (.pptx) and Excel (.xlsx).

What is translated:

* **docx**: every paragraph of the body (tables included), headers, footers, footnotes,
  endnotes and comments; text boxes are paragraphs inside drawings and are found the same
  way (both the DrawingML and the VML fallback copy).
* **pptx**: every paragraph of every slide (shapes, tables, text boxes), speaker notes and
  SmartArt data; layouts and masters (prompt texts a reader never sees) are left alone.
* **xlsx**: shared strings and inline strings of cells on visible sheets. Formulas (and
  their cached values), numbers and dates are not strings and stay as they are; hidden
  sheets are not touched. A shared string that a hidden sheet uses too is copied first, so
  the hidden sheet keeps the original.

Runs become slots (service/text/documents/inline.py): a run's text element with the run's
properties (less what editors change without the reader seeing it: language tags,
spell-check marks) and the containers around it (a hyperlink with its target, a content
control) as its formatting key.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Hashable, Iterator

from lxml import etree

from service.errors import UnsupportedFile
from service.text.documents.inline import Slot, Unit
from service.text.documents.safety import Archive, parse_xml, serialize_xml

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
X = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
PR = "http://schemas.openxmlformats.org/package/2006/relationships"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"

# Children that neither hold text nor break a sentence (bookmarks, spell-check marks,
# comment anchors, hidden field codes, deleted text, phonetic guides).
_ZERO_WIDTH = frozenset(
    [
        "bookmarkStart",
        "bookmarkEnd",
        "proofErr",
        "commentRangeStart",
        "commentRangeEnd",
        "commentReference",
        "annotationRef",
        "lastRenderedPageBreak",
        "permStart",
        "permEnd",
        "softHyphen",
        "instrText",
        "delText",
        "delInstrText",
        "rPh",
        "phoneticPr",
        "extLst",
        "moveFromRangeStart",
        "moveFromRangeEnd",
        "moveToRangeStart",
        "moveToRangeEnd",
        "customXmlInsRangeStart",
        "customXmlInsRangeEnd",
    ]
)
# Elements that end a sentence unit where they stand: line and page breaks, tabs, fields,
# drawings (a text box's paragraphs are units of their own), notes' reference marks.
_HARD = frozenset(
    [
        "br",
        "cr",
        "tab",
        "ptab",
        "fld",
        "fldSimple",
        "fldChar",
        "AlternateContent",
        "drawing",
        "pict",
        "object",
    ]
)
# Run properties editors change without the reader seeing it.
_UNSEEN_PROPERTIES = frozenset(["lang", "noProof"])
_UNSEEN_ATTRIBUTES = frozenset(["lang", "altLang", "dirty", "err", "noProof", "smtClean", "smtId"])


def _local(tag: object) -> str:
    return etree.QName(tag).localname if isinstance(tag, str) else ""


def _attributes(element: etree._Element) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (name, value)
            for name, value in element.attrib.items()
            if _local(name) not in _UNSEEN_ATTRIBUTES and not _local(name).startswith("rsid")
        )
    )


def _properties_key(run: etree._Element) -> Hashable:
    for child in run:
        if _local(child.tag) == "rPr":
            parts: list[Hashable] = [_attributes(child)]
            for prop in child.iter():
                if prop is child or _local(prop.tag) in _UNSEEN_PROPERTIES:
                    continue
                parts.append((prop.tag, _attributes(prop)))
            return tuple(parts)
    return None


def _has_text(element: etree._Element, text_tag: str) -> bool:
    return next(element.iter(text_tag), None) is not None


def paragraph_units(paragraph: etree._Element, text_tag: str, on_write=None) -> list[Unit]:
    """The units of one paragraph (``w:p``, ``a:p``, an ``si``): its own text elements,
    split at hard boundaries; paragraphs nested inside (text boxes) are left to their own
    call."""
    units = [Unit(on_write=on_write)]
    paragraph_tag = paragraph.tag

    def boundary() -> None:
        if units[-1].slots:
            units.append(Unit(on_write=on_write))

    def walk(node: etree._Element, chain: tuple) -> None:
        for child in node:
            name = _local(child.tag)
            if not name or name in _ZERO_WIDTH or name.endswith("Pr"):
                continue
            if child.tag == text_tag:
                properties = _properties_key(node)
                bare = properties is None and all(
                    _local(tag) == "r" and not attrs for tag, attrs in chain
                )
                units[-1].slots.append(Slot(child, "text", (chain, properties), bare))
            elif child.tag == paragraph_tag or name in _HARD or _local(node.tag) == "r":
                boundary()
            elif _has_text(child, text_tag):
                walk(child, (*chain, (child.tag, _attributes(child))))

    walk(paragraph, ())
    return [unit for unit in units if unit.has_text()]


def _preserve_space(element: etree._Element) -> None:
    text = element.text or ""
    if text != text.strip():
        element.set(XML_SPACE, "preserve")


class Parts:
    """The XML parts of an archive being translated: parsed once, written if changed."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self.trees: dict[str, etree._ElementTree] = {}
        self.changed: set[str] = set()

    def tree(self, name: str) -> etree._ElementTree:
        if name not in self.trees:
            if name not in self.archive.data:
                raise UnsupportedFile(f"the file is corrupt ({name} is missing)")
            self.trees[name] = parse_xml(self.archive.data[name], name)
        return self.trees[name]

    def names(self, pattern: str) -> list[str]:
        regex = re.compile(pattern)
        return [info.filename for info in self.archive.infos if regex.fullmatch(info.filename)]

    def replaced(self) -> dict[str, bytes]:
        return {
            name: serialize_xml(self.trees[name], self.archive.data[name]) for name in self.changed
        }


def _paragraph_units(parts: Parts, names: list[str], paragraph: str, text: str, on_write=None):
    for name in names:
        root = parts.tree(name).getroot()
        found = [
            unit
            for element in root.iter(paragraph)
            for unit in paragraph_units(element, text, on_write)
        ]
        if found:
            parts.changed.add(name)
        yield from found


def docx_units(parts: Parts) -> Iterator[Unit]:
    if "word/document.xml" not in parts.archive.data:
        raise UnsupportedFile("the docx file is corrupt (word/document.xml is missing)")
    names = parts.names(r"word/(document|header\d*|footer\d*|footnotes|endnotes|comments)\.xml")
    yield from _paragraph_units(parts, names, f"{{{W}}}p", f"{{{W}}}t", _preserve_space)


def pptx_units(parts: Parts) -> Iterator[Unit]:
    if "ppt/presentation.xml" not in parts.archive.data:
        raise UnsupportedFile("the pptx file is corrupt (ppt/presentation.xml is missing)")
    names = parts.names(r"ppt/(slides/slide\d+|notesSlides/notesSlide\d+|diagrams/data\d+)\.xml")
    yield from _paragraph_units(parts, names, f"{{{A}}}p", f"{{{A}}}t")


def _sheet_paths(parts: Parts) -> list[tuple[str, bool]]:
    """``(part name, visible)`` of every worksheet, in the workbook's order."""
    workbook = parts.tree("xl/workbook.xml").getroot()
    rels = parts.tree("xl/_rels/workbook.xml.rels").getroot()
    targets = {rel.get("Id"): rel.get("Target", "") for rel in rels.iter(f"{{{PR}}}Relationship")}
    sheets = []
    for sheet in workbook.iter(f"{{{X}}}sheet"):
        target = targets.get(sheet.get(f"{{{R}}}id"), "")
        path = target[1:] if target.startswith("/") else posixpath.normpath(f"xl/{target}")
        if path in parts.archive.data:
            sheets.append((path, sheet.get("state", "visible") == "visible"))
    return sheets


def xlsx_units(parts: Parts) -> Iterator[Unit]:
    if "xl/workbook.xml" not in parts.archive.data:
        raise UnsupportedFile("the xlsx file is corrupt (xl/workbook.xml is missing)")
    visible_cells: list[tuple[str, etree._Element]] = []  # (sheet, <v>) of shared-string cells
    hidden_indices: set[int] = set()
    inline: list[tuple[str, etree._Element]] = []
    for path, visible in _sheet_paths(parts):
        for cell in parts.tree(path).getroot().iter(f"{{{X}}}c"):
            if cell.find(f"{{{X}}}f") is not None:
                continue  # a formula: its cached value is the formula's, not text to translate
            kind = cell.get("t")
            value = cell.find(f"{{{X}}}v")
            if kind == "s" and value is not None and (value.text or "").strip().isdigit():
                if visible:
                    visible_cells.append((path, value))
                else:
                    hidden_indices.add(int(value.text or 0))
            elif (
                kind == "inlineStr" and visible and (string := cell.find(f"{{{X}}}is")) is not None
            ):
                inline.append((path, string))

    strings: list[etree._Element] = []
    if visible_cells:
        table = parts.tree("xl/sharedStrings.xml").getroot()
        items = table.findall(f"{{{X}}}si")
        wanted: dict[int, etree._Element] = {}
        copies: dict[int, int] = {}
        for path, value in visible_cells:
            index = int(value.text or 0)
            if index >= len(items):
                raise UnsupportedFile("the xlsx file is corrupt (a cell names a missing string)")
            if index in hidden_indices:
                # A hidden sheet shows this string too: visible cells get a copy to translate.
                if index not in copies:
                    copy = etree.fromstring(etree.tostring(items[index]))
                    table.append(copy)
                    copies[index] = len(items) + len(copies)
                    wanted[copies[index]] = copy
                value.text = str(copies[index])
                parts.changed.add(path)
            else:
                wanted[index] = items[index]
        if copies:
            table.set("uniqueCount", str(len(items) + len(copies)))
        strings = list(wanted.values())
        if strings or copies:
            parts.changed.add("xl/sharedStrings.xml")
    for element in strings:
        yield from paragraph_units(element, f"{{{X}}}t", _preserve_space)
    for path, element in inline:
        found = paragraph_units(element, f"{{{X}}}t", _preserve_space)
        if found:
            parts.changed.add(path)
        yield from found
