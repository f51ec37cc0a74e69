"""Translate whole files (LibreTranslate's ``POST /translate_file``): .txt, .html, .po/.pot, .srt,
Markdown, XLIFF, office documents (.docx, .pptx, .xlsx, .odt, .odp, .ods) and EPUB.

Each format is read with a library that knows it, its translatable texts are collected in
order, translated in one go by an async ``translate_texts`` callable (the route batches them
through the translator), and written back with everything else kept:

``.txt``
    One text per non-blank line (the sentence splitter ends a sentence at a line break
    anyway); line endings and blank lines kept.
``.html`` / ``.htm``
    service/text/html.py (text between the tags; markup, entities, ``code``/``pre`` kept).
``.po`` / ``.pot`` (gettext, with ``polib``)
    Every untranslated entry gets a machine translation: ``msgid`` → ``msgstr``; a plural
    entry's ``msgid`` → ``msgstr[0]`` and ``msgid_plural`` → the other forms. Entries are
    marked ``fuzzy`` (a person should review machine output; gettext tools then skip them
    until they do) and keep their flags (``python-format`` …), context and comments; entries
    that already have a translation are left alone. Placeholders survive because the
    translator masks them. The header gets ``Language``, UTF-8 and, when it has none, the
    target's ``Plural-Forms``. The result passes ``msgfmt --check``; a ``.pot`` comes back
    as a ``.po``.
``.srt`` (with ``srt``)
    One text per subtitle, its lines joined (a sentence often runs over two lines); the
    translation is wrapped back into as many lines as the subtitle had. Timings and
    indices kept.
``.docx`` / ``.pptx`` / ``.xlsx`` / ``.odt`` / ``.odp`` / ``.ods`` / ``.epub``
    service/text/documents/ (whole paragraphs with their formatting runs kept; only the
    parts that hold text change; EPUB's chapters through the HTML path).
``.md`` / ``.markdown`` (with ``markdown-it-py``)
    service/text/documents/markdown.py (code, link targets, images and HTML kept).
``.xlf`` / ``.xliff`` (XLIFF 1.2 and 2.0, with ``translate-toolkit``)
    service/text/documents/xliff.py (empty targets filled, ``state="translated"``, inline
    codes kept).

Decoding text: UTF-8 (a BOM is dropped), else an error; gettext files may declare another
charset, which polib honours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePath

import polib
import srt

from service.errors import UnsupportedFile
from service.text.bulk import TranslateTexts
from service.text.documents import DOCUMENT_EXTENSIONS, translate_document
from service.text.documents.markdown import translate_markdown
from service.text.documents.xliff import translate_xliff
from service.text.html import translate_html

SUPPORTED_EXTENSIONS: tuple[str, ...] = (
    ".txt",
    ".html",
    ".htm",
    ".po",
    ".pot",
    ".srt",
    ".xlf",
    ".xliff",
    ".md",
    ".markdown",
    *DOCUMENT_EXTENSIONS,
)

# Plural-Forms for targets whose header lacks one (gettext's own table, common languages).
_PLURAL_FORMS = {
    "ja": "nplurals=1; plural=0;",
    "ko": "nplurals=1; plural=0;",
    "zh": "nplurals=1; plural=0;",
    "tr": "nplurals=2; plural=(n != 1);",
    "fr": "nplurals=2; plural=(n > 1);",
    "pt": "nplurals=2; plural=(n != 1);",
    "cs": "nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;",
    "pl": "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "ru": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && "
    "(n%100<10 || n%100>=20) ? 1 : 2);",
    "uk": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && "
    "(n%100<10 || n%100>=20) ? 1 : 2);",
    "ar": "nplurals=6; plural=(n==0 ? 0 : n==1 ? 1 : n==2 ? 2 : n%100>=3 && n%100<=10 "
    "? 3 : n%100>=11 ? 4 : 5);",
}
_DEFAULT_PLURAL_FORMS = "nplurals=2; plural=(n != 1);"
_NPLURALS_RE = re.compile(r"nplurals\s*=\s*(\d+)")


@dataclass(frozen=True)
class TranslatedFile:
    filename: str  # the name to download it as (``x.pot`` comes back as ``x.po``)
    content: bytes
    texts: int  # how many texts went to the translator


def supported(filename: str) -> bool:
    return PurePath(filename).suffix.lower() in SUPPORTED_EXTENSIONS


async def translate_file(
    filename: str, content: bytes, target_lang: str, translate_texts: TranslateTexts
) -> TranslatedFile:
    """Translate ``content`` by the format its ``filename`` extension names."""
    suffix = PurePath(filename).suffix.lower()
    if suffix not in SUPPORTED_EXTENSIONS:
        raise UnsupportedFile("file format not supported")
    if suffix in (".po", ".pot"):
        return await _translate_po(filename, content, target_lang, translate_texts)
    if suffix in (".xlf", ".xliff"):
        translated_xliff, count = await translate_xliff(content, target_lang, translate_texts)
        return TranslatedFile(PurePath(filename).name, translated_xliff, count)
    if suffix in DOCUMENT_EXTENSIONS:
        document, count = await translate_document(suffix, content, translate_texts)
        return TranslatedFile(PurePath(filename).name, document, count)
    text = _decode(content)
    if suffix == ".txt":
        translated, count = await _translate_lines(text, translate_texts)
    elif suffix == ".srt":
        translated, count = await _translate_srt(text, translate_texts)
    elif suffix in (".md", ".markdown"):
        translated, count = await translate_markdown(text, translate_texts)
    else:
        translated = await translate_html(text, translate_texts)
        count = -1  # not counted for html
    return TranslatedFile(filename, translated.encode("utf-8"), count)


def _decode(content: bytes) -> str:
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UnsupportedFile(f"the file is not UTF-8 text ({error.reason})") from error


async def _translate_lines(text: str, translate_texts: TranslateTexts) -> tuple[str, int]:
    lines = text.splitlines(keepends=True)
    cores = [line.rstrip("\r\n") for line in lines]
    wanted = [index for index, core in enumerate(cores) if core.strip()]
    translations = await translate_texts([cores[index] for index in wanted]) if wanted else []
    for index, translation in zip(wanted, translations, strict=True):
        ending = lines[index][len(cores[index]) :]
        lines[index] = translation + ending
    return "".join(lines), len(wanted)


async def _translate_srt(text: str, translate_texts: TranslateTexts) -> tuple[str, int]:
    try:
        subtitles = list(srt.parse(text))
    except srt.SRTParseError as error:
        raise UnsupportedFile(f"the file is not valid SubRip: {error}") from error
    wanted = [sub for sub in subtitles if sub.content.strip()]
    sources = [" ".join(line.strip() for line in sub.content.splitlines()) for sub in wanted]
    translations = await translate_texts(sources) if sources else []
    for sub, translation in zip(wanted, translations, strict=True):
        sub.content = _wrap_into_lines(translation, len(sub.content.strip().splitlines()))
    return srt.compose(subtitles, reindex=False), len(wanted)


def _wrap_into_lines(text: str, lines: int) -> str:
    """``text`` split at spaces into at most ``lines`` lines of about equal length."""
    words = text.split()
    if lines <= 1 or len(words) <= 1:
        return text
    target = len(text) / lines
    out: list[list[str]] = [[]]
    length = 0
    for word in words:
        # A word goes to the next line when its middle would fall past this line's share.
        if out[-1] and length + len(word) / 2 > target * len(out) and len(out) < lines:
            out.append([])
        out[-1].append(word)
        length += len(word) + 1
    return "\n".join(" ".join(line) for line in out)


async def _translate_po(
    filename: str, content: bytes, target_lang: str, translate_texts: TranslateTexts
) -> TranslatedFile:
    try:
        catalog = polib.pofile(content.decode("utf-8-sig", errors="strict"))
    except (UnicodeDecodeError, OSError, ValueError) as error:
        raise UnsupportedFile(f"the file is not a valid gettext catalog: {error}") from error
    header = catalog.metadata
    # A template's header says "nplurals=INTEGER": the target language's forms replace it.
    plural_forms = header.get("Plural-Forms") or ""
    if not (declared := _NPLURALS_RE.search(plural_forms)):
        plural_forms = _PLURAL_FORMS.get(target_lang.split("-")[0], _DEFAULT_PLURAL_FORMS)
        declared = _NPLURALS_RE.search(plural_forms)
    assert declared is not None
    nplurals = int(declared.group(1))

    entries = [
        entry
        for entry in catalog
        if not entry.obsolete
        and entry.msgid
        and not entry.translated()
        and not (entry.msgstr or any(entry.msgstr_plural.values()))
    ]
    sources: list[str] = []
    for entry in entries:
        sources.append(entry.msgid)
        if entry.msgid_plural:
            sources.append(entry.msgid_plural)
    translations = iter(await translate_texts(sources) if sources else [])
    for entry in entries:
        singular = next(translations)
        if entry.msgid_plural:
            plural = next(translations)
            entry.msgstr_plural = {
                form: singular if form == 0 else plural for form in range(nplurals)
            }
        else:
            entry.msgstr = singular
        if "fuzzy" not in entry.flags:
            entry.flags.insert(0, "fuzzy")
        entry.previous_msgid = None

    header["Language"] = target_lang
    if header.get("PO-Revision-Date", "").startswith("YEAR"):
        header["PO-Revision-Date"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M+0000")
    if header.get("Last-Translator", "").startswith("FULL NAME"):
        header["Last-Translator"] = "mtserve machine translation"
    content_type = header.get("Content-Type", "")
    if "charset=" not in content_type or "CHARSET" in content_type:
        header["Content-Type"] = "text/plain; charset=UTF-8"
    header.setdefault("Content-Transfer-Encoding", "8bit")
    header.setdefault("MIME-Version", "1.0")
    header["Plural-Forms"] = plural_forms
    catalog.encoding = "utf-8"
    name = PurePath(filename)
    out_name = name.with_suffix(".po").name if name.suffix.lower() == ".pot" else name.name
    return TranslatedFile(out_name, str(catalog).encode("utf-8"), len(sources))
