"""Translate the text of an HTML fragment and keep its markup (LibreTranslate's ``format: "html"``).

Decisions:

* **A real parser.** The standard library's ``html.parser`` reads the fragment (it is lenient
  with the broken markup people paste, needs no native code and keeps entities as they are
  written when ``convert_charrefs`` is off). Every construct it reports (tag, text, entity,
  comment, doctype) keeps its raw source text, so whatever is not translated comes back byte
  for byte: tags with their attributes and quoting, entities, comments, whitespace.
* **Units, not text nodes.** A sentence often spans inline markup (``Click <b>Save</b> to
  keep it``). Translating text nodes one by one would cut it into fragments the model cannot
  translate and would put the bold word in the wrong place. So a *unit* is a run of text,
  entities and inline elements (``a``, ``b``, ``em``, ``span`` …) between block boundaries
  (``p``, ``div``, ``li``, ``br``, ``td`` …, and any tag we do not know as inline). The unit's
  raw source, tags included, goes to the translator as one text; the placeholder machinery
  (service/text/protection.py) masks the inline tags and entities as symbols the model moves
  with the words, and restores them afterwards.
* **What is never translated.** ``script``, ``style``, ``code``, ``pre``, ``textarea``,
  ``kbd``, ``samp``, ``var`` and any element with ``translate="no"`` or the ``notranslate``
  class (HTML's and Google's conventions) pass through whole. Inside a unit such an element
  becomes one opaque placeholder tag (``<mt-keep-0/>``) that is swapped back afterwards, so
  ``Run <code>ls -l</code> now`` keeps the command where the sentence puts it.
* **Whitespace.** Outside ``pre`` (skipped anyway) HTML renders any run of whitespace as one
  space, so a line break inside a paragraph is turned into a space before translation (the
  sentence splitter would otherwise cut the sentence there). Whitespace at a unit's edges
  is kept as written.
* Attribute values (``title``, ``alt``) are kept, not translated, as LibreTranslate does.
* **DeepL's tag options** (:class:`MarkupRules`, for ``tag_handling=xml``): an element of
  ``ignore_tags`` is kept whole, as one opaque piece of its sentence; a tag of
  ``splitting_tags`` always ends a unit and one of ``non_splitting_tags`` never does; with
  ``outline_detection`` off only the splitting tags end units (every other tag is inline).

Pure and synchronous: :func:`parse_html` and :meth:`HtmlDocument.render` do the work, and
:func:`translate_html` wires them to an async ``translate_texts`` callable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser

from service.text.bulk import TranslateTexts


# Phrasing content that may sit inside a sentence (HTML's "phrasing content", less the
# elements that are never translated or that break a line).
def _names(names: str) -> frozenset[str]:
    return frozenset(names.split())


INLINE_TAGS = _names(
    "a abbr acronym b bdi bdo big cite data del dfn em font i img ins label mark q s small "
    "span strike strong sub sup time tt u wbr"
)
# Elements whose content is never translated.
SKIP_TAGS = _names("script style code pre textarea kbd samp var template")
# Inline elements among the skipped ones: they stay inside a unit as one opaque piece.
INLINE_SKIP_TAGS = _names("code kbd samp var")
VOID_TAGS = _names("area base br col embed hr img input link meta param source track wbr")
_KEEP_TAG = "mt-keep-{}"
_NEWLINE = re.compile("\n")
_KEEP_RE = re.compile(r"<mt-keep-(\d+)\s*/>")
# Spaces before a line break are read from the first of them (a match ends past all
# whitespace), so a long run of spaces without a break is read once.
_LINE_BREAK_WHITESPACE = re.compile(r"(?<![ \t])[ \t]*+[\r\n]\s*+")


@dataclass(frozen=True)
class MarkupRules:
    """Which tags end a unit and whose content is kept: HTML's by default, and what DeepL's
    ``ignore_tags``, ``splitting_tags``, ``non_splitting_tags`` and ``outline_detection``
    say (tag names lower-case, as the parser reports them)."""

    ignore: frozenset[str] = frozenset()
    splitting: frozenset[str] = frozenset()
    non_splitting: frozenset[str] = frozenset()
    outline_detection: bool = True  # False: only ``splitting`` tags end a unit

    def is_inline(self, tag: str) -> bool:
        """Whether ``tag`` may sit inside a sentence (else it ends the unit)."""
        if tag in self.splitting:
            return False
        if tag in self.non_splitting or not self.outline_detection:
            return True
        return tag in INLINE_TAGS

    def is_skipped(self, event: _Event) -> bool:
        return event.tag in self.ignore or _is_skipped(event)


@dataclass
class _Event:
    kind: str  # "start", "end", "startend", "text", "entity", "other"
    raw: str
    tag: str = ""
    attrs: dict[str, str | None] = field(default_factory=dict)


class _EventParser(HTMLParser):
    """Records every construct with its raw source text (offsets from ``getpos``)."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=False)
        self.source = source
        line_starts = [0]
        for match in _NEWLINE.finditer(source):
            line_starts.append(match.end())
        self._line_starts = line_starts
        self.starts: list[int] = []
        self.events: list[_Event] = []

    def _record(self, event: _Event) -> None:
        line, column = self.getpos()
        self.starts.append(self._line_starts[line - 1] + column)
        self.events.append(event)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        kind = "startend" if tag in VOID_TAGS else "start"
        self._record(_Event(kind, "", tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._record(_Event("startend", "", tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        self._record(_Event("end", "", tag))

    def handle_data(self, data: str) -> None:
        self._record(_Event("text", ""))

    def handle_entityref(self, name: str) -> None:
        self._record(_Event("entity", ""))

    def handle_charref(self, name: str) -> None:
        self._record(_Event("entity", ""))

    def handle_comment(self, data: str) -> None:
        self._record(_Event("other", ""))

    def handle_decl(self, decl: str) -> None:
        self._record(_Event("other", ""))

    def handle_pi(self, data: str) -> None:
        self._record(_Event("other", ""))

    def unknown_decl(self, data: str) -> None:
        self._record(_Event("other", ""))

    def parse(self) -> list[_Event]:
        self.feed(self.source)
        self.close()
        # Each construct runs from its start to the next one's: nothing of the source is lost.
        ends = [*self.starts[1:], len(self.source)] if self.starts else []  # "" has none
        for event, start, end in zip(self.events, self.starts, ends, strict=True):
            event.raw = self.source[start:end]
        covered = self.starts[0] if self.starts else len(self.source)
        if covered:  # text before the first construct (never happens; kept for safety)
            self.events.insert(0, _Event("text", self.source[:covered]))
        return self.events


def _is_skipped(event: _Event) -> bool:
    if event.tag in SKIP_TAGS:
        return True
    if (event.attrs.get("translate") or "").strip().lower() == "no":
        return True
    return "notranslate" in (event.attrs.get("class") or "").split()


@dataclass
class _Unit:
    """A run of inline content translated as one text."""

    parts: list[tuple[str, str]] = field(default_factory=list)  # (kind, raw)

    def has_text(self) -> bool:
        """Whether there is a word to translate (entities and spaces alone are not sent)."""
        return any(kind == "text" and any(c.isalnum() for c in raw) for kind, raw in self.parts)

    def source(self) -> tuple[str, str, str, list[str]]:
        """``(leading whitespace, text for the translator, trailing whitespace, kept pieces)``."""
        kept: list[str] = []
        pieces: list[str] = []
        for kind, raw in self.parts:
            if kind == "keep":
                pieces.append(f"<{_KEEP_TAG.format(len(kept))}/>")
                kept.append(raw)
            elif kind == "text":
                pieces.append(_LINE_BREAK_WHITESPACE.sub(" ", raw))
            else:
                pieces.append(raw)
        text = "".join(pieces)
        core = text.strip()
        if not core:
            return text, "", "", kept
        start = text.index(core)
        return text[:start], core, text[start + len(core) :], kept

    def raw(self) -> str:
        return "".join(raw for _, raw in self.parts)


@dataclass
class HtmlDocument:
    """A parsed fragment: raw pieces and units, in source order."""

    pieces: list[str | _Unit]

    @property
    def units(self) -> list[_Unit]:
        return [piece for piece in self.pieces if isinstance(piece, _Unit) and piece.has_text()]

    def texts(self) -> list[str]:
        """What to translate, one text per unit with words in it."""
        return [unit.source()[1] for unit in self.units]

    def render(self, translations: Sequence[str]) -> str:
        """The fragment with each unit replaced by its translation (in :meth:`texts` order)."""
        units = self.units
        if len(translations) != len(units):
            raise ValueError(f"{len(units)} texts but {len(translations)} translations")
        translated = dict(zip(map(id, units), translations, strict=True))
        out: list[str] = []
        for piece in self.pieces:
            if isinstance(piece, str):
                out.append(piece)
            elif id(piece) not in translated:
                out.append(piece.raw())
            else:
                leading, _, trailing, kept = piece.source()
                text = _restore_kept(translated[id(piece)], kept)
                out.append(f"{leading}{text}{trailing}")
        return "".join(out)


def _restore_kept(translation: str, kept: list[str]) -> str:
    """Swap the opaque ``<mt-keep-k/>`` tags back for the elements they stand for."""

    def original(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return kept[index] if index < len(kept) else ""

    return _KEEP_RE.sub(original, translation)


def parse_html(source: str, rules: MarkupRules = MarkupRules()) -> HtmlDocument:
    """Split ``source`` into untranslated raw pieces and translatable units."""
    events = _EventParser(source).parse()
    pieces: list[str | _Unit] = []
    unit = _Unit()

    def close_unit() -> None:
        nonlocal unit
        if unit.parts:
            pieces.append(unit)
            unit = _Unit()

    index = 0
    while index < len(events):
        event = events[index]
        if event.kind in ("start", "startend") and rules.is_skipped(event):
            end = _matching_end(events, index) if event.kind == "start" else index
            raw = "".join(e.raw for e in events[index : end + 1])
            if (
                event.tag in INLINE_SKIP_TAGS
                or rules.is_inline(event.tag)
                or (event.tag in rules.ignore and event.tag not in rules.splitting)
            ):
                unit.parts.append(("keep", raw))
            else:
                close_unit()
                pieces.append(raw)
            index = end + 1
            continue
        if event.kind in ("text", "entity"):
            unit.parts.append((event.kind, event.raw))
        elif event.kind in ("start", "end", "startend") and rules.is_inline(event.tag):
            unit.parts.append(("tag", event.raw))
        else:
            close_unit()
            pieces.append(event.raw)
        index += 1
    close_unit()
    return HtmlDocument(pieces)


def _matching_end(events: list[_Event], start: int) -> int:
    """Index of the end tag closing ``events[start]`` (nesting counted), or the last event."""
    tag = events[start].tag
    depth = 0
    for index in range(start, len(events)):
        event = events[index]
        if event.tag != tag:
            continue
        if event.kind == "start":
            depth += 1
        elif event.kind == "end":
            depth -= 1
            if depth == 0:
                return index
    return len(events) - 1


async def translate_html(
    source: str, translate_texts: TranslateTexts, rules: MarkupRules = MarkupRules()
) -> str:
    """Translate the text of an HTML fragment; markup, entities and skipped elements kept."""
    document = parse_html(source, rules)
    texts = document.texts()
    if not texts:
        return source
    return document.render(await translate_texts(texts))
