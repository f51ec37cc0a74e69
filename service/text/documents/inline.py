"""A paragraph's formatted text as one text for the translator, and back into its runs.

Word, PowerPoint, Excel and LibreOffice keep a paragraph as a sequence of runs, each with
its own formatting; editors split runs for reasons no reader sees (spell-check marks,
revision ids), so a sentence is often spread over several. Translating run by run (what
argos-translate-files does) cuts sentences into pieces the model cannot translate and puts
words in the wrong formatting. So:

* A **slot** is one place text lives (an element's ``text`` or ``tail``) with the
  formatting it shows in (``key``: the run properties and the links, spans … around it).
* A **unit** is the slots of a paragraph between hard boundaries (tabs, line breaks, fields,
  drawings, notes), translated as one text. Neighbouring slots with the same key form one
  **group**.
* The paragraph's unformatted text (or, where every run is formatted, its most common
  formatting) is *plain*: its groups go to the translator as bare text. Every other group is wrapped in a tag of its own, ``<mt-g3>…</mt-g3>``, which the
  placeholder machinery (service/text/protection.py) masks like the HTML path's inline tags,
  so the model moves it with the words it encloses.
* **Writing back** keeps the document's structure (runs, links, bookmarks, fields) and only
  changes text: a tagged group's translation goes into its first slot, the text outside
  tags into the plain groups (each piece into the plain group after the tag it follows),
  and the other slots of a group are emptied. Formatting therefore stays on the words the
  translation puts inside the tag; the order of runs stays the document's.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from lxml import etree

_TAG = "mt-g{}"
TAG_RE = re.compile(r"<(/?)mt-g(\d+)\s*/?>", re.IGNORECASE)  # a formatting boundary


@dataclass
class Slot:
    element: etree._Element
    attr: str  # "text" or "tail"
    key: Hashable
    bare: bool = False  # the text has no formatting of its own (no run properties, no link)

    def get(self) -> str:
        return getattr(self.element, self.attr) or ""

    def set(self, value: str) -> None:
        setattr(self.element, self.attr, value or None)


@dataclass
class _Group:
    key: Hashable
    slots: list[Slot]
    text: str
    bare: bool = False
    tag: int | None = None  # None for plain and blank groups
    blank: bool = False


@dataclass
class Unit:
    """Slots translated as one text; ``on_write`` adjusts an element after its text changes
    (Word's ``xml:space="preserve"``)."""

    slots: list[Slot] = field(default_factory=list)
    on_write: Callable[[etree._Element], None] | None = None

    def _groups(self) -> list[_Group]:
        groups: list[_Group] = []
        for slot in self.slots:
            if groups and groups[-1].key == slot.key:
                groups[-1].slots.append(slot)
                groups[-1].text += slot.get()
            else:
                groups.append(_Group(slot.key, [slot], slot.get(), slot.bare))
        # Unformatted text is plain before any formatting, however short it is ("Paid" before
        # a bold "in full"): then the spaces between tags belong to unformatted runs.
        weight: Counter[Hashable] = Counter()
        for group in groups:
            group.blank = not group.text.strip()
            if not group.blank:
                weight[group.key] += len(group.text) + (1 << 30 if group.bare else 0)
        plain = weight.most_common(1)[0][0] if weight else None
        for number, group in enumerate(groups, start=1):
            if not group.blank and group.key != plain:
                group.tag = number
        return groups

    def text(self) -> str:
        """The unit's text with non-plain groups tagged (edges' whitespace included)."""
        pieces = []
        for group in self._groups():
            if group.tag is None:
                pieces.append(group.text)
                continue
            core = group.text.strip()
            start = group.text.index(core)
            tag = _TAG.format(group.tag)
            pieces.append(
                f"{group.text[:start]}<{tag}>{core}</{tag}>{group.text[start + len(core) :]}"
            )
        return "".join(pieces)

    def source(self) -> tuple[str, str, str]:
        """``(leading whitespace, text for the translator, trailing whitespace)``."""
        text = self.text()
        core = text.strip()
        if not core:
            return text, "", ""
        start = text.index(core)
        return text[:start], core, text[start + len(core) :]

    def has_text(self) -> bool:
        """Whether there is a word to translate (numbers, dates and blanks stay as they are)."""
        return any(char.isalpha() for slot in self.slots for char in slot.get())

    def write(self, translation: str) -> None:
        """Put ``translation`` (of :meth:`source`'s text) back into the slots."""
        leading, _, trailing = self.source()
        groups = self._groups()
        by_tag = {group.tag: group for group in groups if group.tag is not None}
        plain = [
            index for index, group in enumerate(groups) if group.tag is None and not group.blank
        ]
        tagged_text: dict[int, list[str]] = {}
        plain_text: dict[int, list[str]] = {}
        position = {group.tag: index for index, group in enumerate(groups) if group.tag}
        inside: int | None = None
        after = -1  # the index of the group the current untagged text follows
        cursor = 0
        full = f"{leading}{translation}{trailing}"

        def take(text: str) -> None:
            if not text:
                return
            if inside is not None:
                tagged_text.setdefault(inside, []).append(text)
                return
            # the first plain group after ``after`` (a bisection: a paragraph may have
            # tens of thousands of runs, so a scan per piece would be quadratic)
            following = bisect.bisect_right(plain, after)
            target = plain[following] if following < len(plain) else plain[-1] if plain else None
            if target is None:  # no plain group: the text joins the first tagged one
                target_group = min(by_tag) if by_tag else None
                if target_group is not None:
                    tagged_text.setdefault(target_group, []).append(text)
                return
            plain_text.setdefault(target, []).append(text)

        for match in TAG_RE.finditer(full):
            take(full[cursor : match.start()])
            cursor = match.end()
            number = int(match.group(2))
            if number not in by_tag:
                continue  # not one of ours: dropped, as the tag never was document text
            if match.group(1):
                inside = None
                after = position[number]
            else:
                inside = number
        take(full[cursor:])

        for index, group in enumerate(groups):
            if group.tag is not None:
                value = "".join(tagged_text.get(group.tag, []))
            elif group.blank:
                value = ""  # its whitespace now comes with the translation around it
            else:
                value = "".join(plain_text.get(index, []))
            for number, slot in enumerate(group.slots):
                slot.set(value if number == 0 else "")
                if self.on_write is not None:
                    self.on_write(slot.element)
