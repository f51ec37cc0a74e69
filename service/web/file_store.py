"""Translated files waiting for their download (LibreTranslate's ``/download_file/<name>``).

Stored as ``<uuid4>.<sanitized original name>``, like LibreTranslate, so the download URL is
unguessable and the download name is the original's: in one directory for one process, or in
the shared database (``MT_DATABASE_URL``) where replicas share one, since the download may
reach another replica than the upload did. Files older than the time to live are deleted
whenever a new one is saved (LibreTranslate sweeps every 30 minutes with a scheduler;
sweeping on save needs no thread and keeps the store bounded by the traffic of one TTL).
"""

from __future__ import annotations

import mimetypes
import re
import time
import uuid
from pathlib import Path
from urllib.parse import quote

from fastapi import Response

from service.storage.database import Database
from service.storage.migrations import Migration

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STORED_NAME = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[A-Za-z0-9._-]+$"
)
MIGRATIONS = [
    Migration(
        1,
        """
        CREATE TABLE translated_files (
            name TEXT PRIMARY KEY,
            content {BLOB} NOT NULL,
            created_at DOUBLE PRECISION NOT NULL
        )
        """,
    ),
]


def safe_filename(name: str) -> str:
    """``name`` without directories and without characters that are unsafe in a path or a
    header (werkzeug's ``secure_filename``, which LibreTranslate uses, in spirit)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _UNSAFE.sub("_", base).strip("._")
    return cleaned or "file"


def attachment(content: bytes, filename: str) -> Response:
    """``content`` to download as ``filename`` (its type guessed from the name, as a file
    response would)."""
    quoted = quote(filename)
    disposition = (
        f'attachment; filename="{filename}"'
        if quoted == filename
        else f"attachment; filename*=utf-8''{quoted}"
    )
    media_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    return Response(content, media_type=media_type, headers={"Content-Disposition": disposition})


class TranslatedFiles:
    def __init__(self, directory: Path, ttl_s: float, database: Database | None = None) -> None:
        """``database``: keep the files there instead of in ``directory`` (replicas)."""
        self.directory = Path(directory)
        self.ttl_s = ttl_s
        self.database = database
        if database is not None:
            database.add_migrations("translated_files", MIGRATIONS)

    def save(self, original_name: str, content: bytes) -> str:
        """Store ``content``; returns the stored name (the download URL's last part)."""
        self.sweep()
        stored = f"{uuid.uuid4()}.{safe_filename(original_name)}"
        if self.database is not None:
            with self.database.transaction() as db:
                db.execute(
                    "INSERT INTO translated_files (name, content, created_at) VALUES (?, ?, ?)",
                    (stored, content, time.time()),
                )
            return stored
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / stored).write_bytes(content)
        return stored

    def content(self, stored_name: str) -> bytes | None:
        """The file for a stored name, or None when the name is not one we hand out (path
        traversal included) or the file is gone."""
        if not _STORED_NAME.match(stored_name):
            return None
        if self.database is not None:
            with self.database.read() as db:
                row = db.execute(
                    "SELECT content FROM translated_files WHERE name = ? AND created_at >= ?",
                    (stored_name, time.time() - self.ttl_s),
                ).fetchone()
            return bytes(row[0]) if row is not None else None
        path = self.directory / stored_name
        return path.read_bytes() if path.is_file() else None

    @staticmethod
    def download_name(stored_name: str) -> str:
        """The name the client downloads it as: the stored name without its uuid."""
        return stored_name.split(".", 1)[1]

    def sweep(self) -> int:
        """Delete stored files older than the TTL; returns how many."""
        cutoff = time.time() - self.ttl_s
        if self.database is not None:
            with self.database.transaction() as db:
                return db.execute(
                    "DELETE FROM translated_files WHERE created_at < ?", (cutoff,)
                ).rowcount
        removed = 0
        for path in self.directory.glob("*"):
            try:
                if _STORED_NAME.match(path.name) and path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue  # another worker swept it
        return removed
