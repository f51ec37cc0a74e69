"""EPUB: a zip archive of XHTML chapters, translated through the HTML path.

The package document (found through ``META-INF/container.xml``) lists the book's content;
every item of type ``application/xhtml+xml`` (chapters and the navigation document) is
translated by service/text/html.py, which keeps every tag, attribute and entity as written
and never translates ``code``/``pre``/``script``/``style``. The NCX table of contents of
EPUB 2 (``navLabel/text``) is translated too, so the reader's menu matches the chapters.
Metadata, stylesheets, images and fonts are left alone. Every part is checked like the
office formats' (no entity declarations, well-formed XML) before its text is read.

XHTML is XML, so what the model writes must stay well-formed: a bare ``&`` or ``<`` in a
translation (the source's own are entities, masked and restored) is escaped.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import unquote

from lxml import etree

from service.errors import UnsupportedFile
from service.text.bulk import TranslateTexts
from service.text.documents.inline import Slot, Unit
from service.text.documents.safety import Archive, open_archive, parse_xml, serialize_xml
from service.text.html import HtmlDocument, parse_html

CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
OPF = "http://www.idpf.org/2007/opf"
NCX = "http://www.daisy.org/z3986/2005/ncx/"
_BARE_AMPERSAND = re.compile(r"&(?!#[0-9]+;|#x[0-9a-fA-F]+;|[A-Za-z][A-Za-z0-9]*;)")
_BARE_LESS_THAN = re.compile(r"<(?![A-Za-z/!?])")


def _xml_safe(text: str) -> str:
    return _BARE_LESS_THAN.sub("&lt;", _BARE_AMPERSAND.sub("&amp;", text))


def _content_items(archive: Archive) -> tuple[list[str], list[str]]:
    """``(xhtml parts, ncx parts)`` of the book, in the manifest's order."""
    if "META-INF/container.xml" not in archive.data:
        raise UnsupportedFile("the epub file is corrupt (META-INF/container.xml is missing)")
    container = parse_xml(archive.data["META-INF/container.xml"], "META-INF/container.xml")
    rootfile = container.getroot().find(f".//{{{CONTAINER}}}rootfile")
    package_path = rootfile.get("full-path", "") if rootfile is not None else ""
    if package_path not in archive.data:
        raise UnsupportedFile("the epub file is corrupt (its package document is missing)")
    package = parse_xml(archive.data[package_path], package_path).getroot()
    base = posixpath.dirname(package_path)
    xhtml, ncx = [], []
    for item in package.iter(f"{{{OPF}}}item"):
        path = posixpath.normpath(posixpath.join(base, unquote(item.get("href", ""))))
        if path not in archive.data:
            continue
        media_type = item.get("media-type", "")
        if media_type == "application/xhtml+xml":
            xhtml.append(path)
        elif media_type == "application/x-dtbncx+xml":
            ncx.append(path)
    return xhtml, ncx


async def translate_epub(content: bytes, translate_texts: TranslateTexts) -> tuple[bytes, int]:
    """The translated book and how many texts went to the translator."""
    archive = open_archive(content, "epub")
    xhtml_parts, ncx_parts = _content_items(archive)
    chapters: dict[str, HtmlDocument] = {}
    texts: list[str] = []
    for name in xhtml_parts:
        parse_xml(archive.data[name], name)  # entities refused, well-formedness checked
        try:
            source = archive.data[name].decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise UnsupportedFile(f"{name} is not UTF-8 ({error.reason})") from error
        chapters[name] = parse_html(source)
        texts += chapters[name].texts()
    tables: dict[str, etree._ElementTree] = {}
    labels: list[Unit] = []
    for name in ncx_parts:
        tree = parse_xml(archive.data[name], name)
        found = [
            unit
            for label in tree.getroot().iter(f"{{{NCX}}}text")
            if (unit := Unit([Slot(label, "text", None, True)])).has_text()
        ]
        if found:
            tables[name] = tree
            labels += found
    sources = texts + [unit.source()[1] for unit in labels]
    if not sources:
        return content, 0
    translations = await translate_texts(sources)
    replaced: dict[str, bytes] = {}
    position = 0
    for name, document in chapters.items():
        count = len(document.texts())
        if count:
            chunk = [_xml_safe(text) for text in translations[position : position + count]]
            replaced[name] = document.render(chunk).encode("utf-8")
        position += count
    for unit, translation in zip(labels, translations[position:], strict=True):
        unit.write(translation)
    for name, tree in tables.items():
        replaced[name] = serialize_xml(tree, archive.data[name])
    return archive.write(replaced), len(sources)
