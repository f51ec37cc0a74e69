"""Documents (docx, pptx, xlsx, odt, odp, ods, epub) translated with their formatting kept.

Each is a zip archive of XML. The archive is checked (service/text/documents/safety.py),
the parts that hold text are parsed, every paragraph becomes units of formatted text
(service/text/documents/inline.py), all units go to ``translate_texts`` in one call, and the
archive is written again with only the changed parts replaced: every other entry, and the
order and compression of all of them, stay as they were. EPUB's chapters are XHTML and go
through the HTML path instead (service/text/documents/epub.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from service.text.bulk import TranslateTexts
from service.text.documents import epub, odf, ooxml
from service.text.documents.inline import Unit
from service.text.documents.ooxml import Parts
from service.text.documents.safety import open_archive

_READERS: dict[str, Callable[[Parts], Iterator[Unit]]] = {
    ".docx": ooxml.docx_units,
    ".pptx": ooxml.pptx_units,
    ".xlsx": ooxml.xlsx_units,
    ".odt": odf.odt_units,
    ".odp": odf.odp_units,
    ".ods": odf.ods_units,
}
DOCUMENT_EXTENSIONS: tuple[str, ...] = (*_READERS, ".epub")


async def translate_document(
    suffix: str, content: bytes, translate_texts: TranslateTexts
) -> tuple[bytes, int]:
    """The translated document and how many texts went to the translator."""
    if suffix == ".epub":
        return await epub.translate_epub(content, translate_texts)
    parts = Parts(open_archive(content, suffix.lstrip(".")))
    units = list(_READERS[suffix](parts))
    if not units:
        return content, 0
    sources = [unit.source()[1] for unit in units]
    translations = await translate_texts(sources)
    for unit, translation in zip(units, translations, strict=True):
        unit.write(translation)
    return parts.archive.write(parts.replaced()), len(sources)
