"""XLIFF 1.2 and 2.0 (the exchange format of CAT tools), read and written with translate-toolkit.

Every unit (1.2: ``trans-unit``; 2.0: each ``segment`` of a ``unit``) whose target is
missing or empty gets the machine translation of its source, marked ``state="translated"``;
a target the file already has (a translator's work) is kept, and so are units marked
``translate="no"``. A source without a letter (a number, a code) is copied as it is.

Inline codes stay codes: a paired code with text inside (1.2 ``<g>``, ``<mrk>``; 2.0
``<pc>``, ``<mrk>``) becomes a tag the model moves with its words, as the HTML path's inline
tags; a standalone code (``<x/>``, ``<bx/>``, ``<ex/>``, ``<ph>``, ``<bpt>``, ``<ept>``,
``<it>``; 2.0 ``<ph/>``, ``<sc/>``, ``<ec/>``) is one opaque placeholder, copied back whole with
its attributes and native code. A code the translation lost is appended at the end of the
target, so the file still validates in the CAT tool. The source's own ``&`` and ``<`` go to the
translator as entities (masked and restored like the HTML path's).
"""

from __future__ import annotations

import copy
import html
import re
from collections.abc import Iterator

from lxml import etree
from translate.storage import xliff, xliff2

from service.errors import UnsupportedFile
from service.text.bulk import TranslateTexts
from service.text.documents.safety import parse_xml

XLIFF_20 = "urn:oasis:names:tc:xliff:document:2.0"
_PAIRED = frozenset(["g", "mrk", "pc"])
_TOKEN_RE = re.compile(r"<(/?)mt-([gx])(\d+)\s*(/?)>")


def _local(tag: object) -> str:
    return etree.QName(tag).localname if isinstance(tag, str) else ""


def source_text(source: etree._Element) -> tuple[str, dict[int, etree._Element]]:
    """The source's content for the translator, and its inline codes by number."""
    codes: dict[int, etree._Element] = {}
    pieces = [html.escape(source.text or "", quote=False)]

    def walk(node: etree._Element) -> None:
        for child in node:
            if not isinstance(child.tag, str):  # a comment or processing instruction
                pieces.append(html.escape(child.tail or "", quote=False))
                continue
            number = len(codes) + 1
            codes[number] = child
            if _local(child.tag) in _PAIRED:
                pieces.append(f"<mt-g{number}>{html.escape(child.text or '', quote=False)}")
                walk(child)
                pieces.append(f"</mt-g{number}>")
            else:
                pieces.append(f"<mt-x{number}/>")
            pieces.append(html.escape(child.tail or "", quote=False))

    walk(source)
    return "".join(pieces), codes


def fill_target(target: etree._Element, translation: str, codes: dict[int, etree._Element]) -> None:
    """Write ``translation`` (of :func:`source_text`'s text) into ``target``, codes rebuilt."""
    for child in list(target):
        target.remove(child)
    target.text = None
    stack: list[tuple[int, etree._Element]] = [(0, target)]
    used: set[int] = set()

    def add_text(text: str) -> None:
        text = html.unescape(text)
        node = stack[-1][1]
        if len(node):
            node[-1].tail = (node[-1].tail or "") + text
        else:
            node.text = (node.text or "") + text

    cursor = 0
    for match in _TOKEN_RE.finditer(translation):
        add_text(translation[cursor : match.start()])
        cursor = match.end()
        closing, kind, number = match.group(1), match.group(2), int(match.group(3))
        code = codes.get(number)
        if code is None or (number in used and not closing):
            continue  # not one of ours, or given twice: the copy is dropped
        if closing:
            if any(entry == number for entry, _ in stack):
                while stack[-1][0] != number:
                    stack.pop()
                stack.pop()
            continue
        used.add(number)
        if kind == "x" or _local(code.tag) not in _PAIRED:
            whole = copy.deepcopy(code)
            whole.tail = None
            stack[-1][1].append(whole)
        else:
            stack.append((number, etree.SubElement(stack[-1][1], code.tag, dict(code.attrib))))
    add_text(translation[cursor:])
    for number, code in codes.items():
        if number not in used:
            if _local(code.tag) in _PAIRED:
                lost = etree.Element(code.tag, dict(code.attrib))
            else:
                lost = copy.deepcopy(code)
                lost.tail = None
            target.append(lost)


def _has_letter(element: etree._Element) -> bool:
    return any(char.isalpha() for char in "".join(element.itertext()))


def _pairs_12(store: xliff.xlifffile) -> Iterator[tuple[etree._Element, etree._Element]]:
    """``(source, target)`` of each 1.2 unit to translate (the target created if missing)."""
    for unit in store.units:
        if unit.isheader():
            continue
        element = unit.xmlelement
        if element.get("translate") == "no":
            continue
        source = unit.source_dom
        target = unit.target_dom
        if source is None or (target is not None and "".join(target.itertext()).strip()):
            continue
        if target is None:
            target = etree.Element(source.tag.replace("source", "target"))
            source.addnext(target)
            target.tail = source.tail
        yield source, target


def _pairs_20(store: xliff2.Xliff2File) -> Iterator[tuple[etree._Element, etree._Element]]:
    units = list(dict.fromkeys(unit.xmlelement for unit in store.units))
    for element in units:
        for segment in element.iter(f"{{{XLIFF_20}}}segment"):
            # translate="no" is inherited from the unit, a group or the file.
            if any(a.get("translate") == "no" for a in segment.iterancestors()):
                continue
            source = segment.find(f"{{{XLIFF_20}}}source")
            target = segment.find(f"{{{XLIFF_20}}}target")
            if source is None or (target is not None and "".join(target.itertext()).strip()):
                continue
            if target is None:
                target = etree.Element(f"{{{XLIFF_20}}}target")
                source.addnext(target)
                target.tail = source.tail
            yield source, target


def _mark_translated(target: etree._Element, version: str) -> None:
    segment = target.getparent()
    if version == "2.0" and segment is not None:  # 2.0 keeps the state on <segment>
        segment.set("state", "translated")
    else:
        target.set("state", "translated")


async def translate_xliff(
    content: bytes, target_lang: str, translate_texts: TranslateTexts
) -> tuple[bytes, int]:
    """The XLIFF file with its empty targets filled, and how many texts were translated."""
    root = parse_xml(content, "the xliff file").getroot()  # entities refused, well-formed
    version = "2.0" if etree.QName(root).namespace == XLIFF_20 else "1.2"
    try:
        store = (
            xliff2.Xliff2File.parsestring(content)
            if version == "2.0"
            else xliff.xlifffile.parsestring(content)
        )
    except Exception as error:  # translate-toolkit raises what lxml or its own checks raise
        raise UnsupportedFile(f"the file is not valid XLIFF {version} ({error})") from error
    pairs = list(_pairs_20(store) if version == "2.0" else _pairs_12(store))
    wanted: list[tuple[etree._Element, str, dict[int, etree._Element]]] = []
    for source, target in pairs:
        if _has_letter(source):
            text, codes = source_text(source)
            wanted.append((target, text, codes))
        else:  # nothing to translate: the target is the source
            target.text = source.text
            for child in source:
                target.append(copy.deepcopy(child))
        _mark_translated(target, version)
    translations = await translate_texts([text for _, text, _ in wanted]) if wanted else []
    for (target, _, codes), translation in zip(wanted, translations, strict=True):
        fill_target(target, translation, codes)
    if version == "2.0":
        if not root.get("trgLang"):
            store.document.getroot().set("trgLang", target_lang)
    else:
        for file in store.document.getroot().iter("{*}file"):
            if not file.get("target-language"):
                file.set("target-language", target_lang)
    return bytes(store), len(wanted)
