"""Translated files waiting for their download (LibreTranslate's ``/download_file/<name>``).

Stored as ``<uuid4>.<sanitized original name>`` in one directory, like LibreTranslate, so the
download URL is unguessable and the download name is the original's. Files older than the
time to live are deleted whenever a new one is saved (LibreTranslate sweeps every 30 minutes
with a scheduler; sweeping on save needs no thread and keeps the directory bounded by the
traffic of one TTL).
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STORED_NAME = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[A-Za-z0-9._-]+$"
)


def safe_filename(name: str) -> str:
    """``name`` without directories and without characters that are unsafe in a path or a
    header (werkzeug's ``secure_filename``, which LibreTranslate uses, in spirit)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _UNSAFE.sub("_", base).strip("._")
    return cleaned or "file"


class TranslatedFiles:
    def __init__(self, directory: Path, ttl_s: float) -> None:
        self.directory = Path(directory)
        self.ttl_s = ttl_s

    def save(self, original_name: str, content: bytes) -> str:
        """Store ``content``; returns the stored name (the download URL's last part)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sweep()
        stored = f"{uuid.uuid4()}.{safe_filename(original_name)}"
        (self.directory / stored).write_bytes(content)
        return stored

    def path(self, stored_name: str) -> Path | None:
        """The file for a stored name, or None when the name is not one we hand out (path
        traversal included) or the file is gone."""
        if not _STORED_NAME.match(stored_name):
            return None
        path = self.directory / stored_name
        return path if path.is_file() else None

    @staticmethod
    def download_name(stored_name: str) -> str:
        """The name the client downloads it as: the stored name without its uuid."""
        return stored_name.split(".", 1)[1]

    def sweep(self) -> int:
        """Delete stored files older than the TTL; returns how many."""
        cutoff = time.time() - self.ttl_s
        removed = 0
        for path in self.directory.glob("*"):
            try:
                if _STORED_NAME.match(path.name) and path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue  # another worker swept it
        return removed
