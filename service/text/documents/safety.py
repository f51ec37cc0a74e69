"""Opening untrusted archives and XML: zip limits and a parser that never expands entities.

Office documents and EPUB are zip archives of XML, so an upload can be a zip bomb (a small
file that inflates to gigabytes, or millions of entries) or XML that declares entities
(XXE reads local files or URLs; billion laughs inflates in memory). Decisions:

* **Limits before inflating.** The central directory declares every entry's size; the
  archive is refused when it has too many entries, too many bytes in all, or an entry that
  inflates more than :data:`MAX_RATIO` times (past a small floor).
* **Limits while inflating.** Declared sizes are the attacker's word: ``zipfile`` inflates
  a whole bzip2 or LZMA stream, and as much of a deflate stream as one ``read()`` asks for,
  before it cuts the result to the declared size. So only stored and deflate entries are
  read (OOXML, ODF and EPUB use no other method), in chunks of :data:`READ_CHUNK` bytes, and
  ``zipfile`` stops each entry at its declared size and checks its CRC there. Memory per
  archive stays within its declared total plus one chunk.
* **No DTD at all.** OOXML, ODF and EPUB's XHTML need no document type declaration with
  entities, so any ``<!DOCTYPE …[`` or ``<!ENTITY`` is refused before parsing, and lxml
  parses with entity resolution, DTD loading and network access off as a second wall.
* **Encrypted or corrupt input** is a 400 with a message that says which (a password-
  protected Office file is an OLE compound file, not a zip).
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass

from lxml import etree

from service.errors import UnsupportedFile

MAX_ENTRIES = 10_000
MAX_UNCOMPRESSED_BYTES = 200 * 1024 * 1024
MAX_RATIO = 200
RATIO_FLOOR_BYTES = 1024 * 1024  # small entries may compress well (a blank sheet, a style)
READ_CHUNK = 64 * 1024
# The compression methods the supported formats use; others (bzip2, LZMA) inflate whole.
ALLOWED_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# A DOCTYPE with an internal subset, or an entity. The scan from one DOCTYPE stops at the
# next one, which goes on from there, so a file of repeated DOCTYPEs is read once.
_DTD_RE = re.compile(rb"<!DOCTYPE(?:[^>\[<]|<(?!!DOCTYPE))*+\[|<!ENTITY", re.IGNORECASE)
_DECLARATION_RE = re.compile(rb"^\s*<\?xml[^>]*\?>[ \t\r\n]*")


@dataclass
class Archive:
    """The entries of a checked zip archive, in their order, with their bytes."""

    infos: list[zipfile.ZipInfo]
    data: dict[str, bytes]

    def write(self, replaced: dict[str, bytes]) -> bytes:
        """The archive again with ``replaced`` entries swapped in; everything else (order,
        names, compression, timestamps, bytes) as it was."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for info in self.infos:
                archive.writestr(info, replaced.get(info.filename, self.data[info.filename]))
        return out.getvalue()


def open_archive(content: bytes, kind: str) -> Archive:
    """Read ``content`` as a zip archive within the limits, or refuse it."""
    if content.startswith(_OLE_MAGIC):
        raise UnsupportedFile(
            f"the {kind} file is encrypted (password-protected) or in the old binary format"
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(content))
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as error:
        raise UnsupportedFile(f"the {kind} file is corrupt (not a readable zip archive)") from error
    if len(infos) > MAX_ENTRIES:
        raise UnsupportedFile(f"the {kind} file has more than {MAX_ENTRIES} entries")
    if sum(info.file_size for info in infos) > MAX_UNCOMPRESSED_BYTES:
        raise UnsupportedFile(
            f"the {kind} file inflates to more than {MAX_UNCOMPRESSED_BYTES} bytes"
        )
    for info in infos:
        if info.flag_bits & 0x1:
            raise UnsupportedFile(f"the {kind} file is encrypted (password-protected)")
        if info.compress_type not in ALLOWED_METHODS:
            raise UnsupportedFile(
                f"the {kind} file uses an unsupported compression method "
                f"({info.compress_type}) in {info.filename}"
            )
        if info.file_size > RATIO_FLOOR_BYTES and info.file_size > MAX_RATIO * max(
            info.compress_size, 1
        ):
            raise UnsupportedFile(f"the {kind} file looks like a zip bomb ({info.filename})")
    data: dict[str, bytes] = {}
    try:
        for info in infos:
            data[info.filename] = _read_entry(archive, info)
    except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, RuntimeError) as error:
        raise UnsupportedFile(f"the {kind} file is corrupt ({error})") from error
    return Archive(infos, data)


def _read_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """One entry's bytes, inflated a chunk at a time: ``zipfile`` stops at the declared size
    (and checks the CRC there), so the declared sizes checked above bound the memory."""
    chunks: list[bytes] = []
    with archive.open(info) as entry:
        while chunk := entry.read(READ_CHUNK):
            chunks.append(chunk)
    return b"".join(chunks)


def parse_xml(data: bytes, name: str) -> etree._ElementTree:
    """Parse one XML part; a DTD with entities, or malformed XML, is refused."""
    if _DTD_RE.search(data):
        raise UnsupportedFile(f"{name} declares XML entities (refused)")
    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False
    )
    try:
        tree = etree.parse(io.BytesIO(data), parser)
    except etree.XMLSyntaxError as error:
        raise UnsupportedFile(f"{name} is not well-formed XML ({error})") from error
    # A bare ``<!DOCTYPE html>`` (XHTML) is a DTD without declarations: only entities refuse.
    dtd = tree.docinfo.internalDTD
    if dtd is not None and next(iter(dtd.iterentities()), None) is not None:
        raise UnsupportedFile(f"{name} declares XML entities (refused)")
    return tree


def serialize_xml(tree: etree._ElementTree, original: bytes) -> bytes:
    """``tree`` as bytes, with the part's own XML declaration kept as it was written."""
    body = etree.tostring(tree, encoding="UTF-8", xml_declaration=False)
    declaration = _DECLARATION_RE.match(original)
    if declaration and b"utf-8" in declaration.group().lower():
        return declaration.group() + body
    if declaration:  # another encoding: lxml writes a declaration that matches its bytes
        return etree.tostring(tree, encoding="UTF-8", xml_declaration=True)
    return body
