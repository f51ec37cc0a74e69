"""Document jobs counted for /metrics: jobs by state and the sentences they have left, read
from the jobs' SQLite file (service/translation/document_jobs.py) on a read-only connection
of its own, so a scrape never waits on the store's lock nor creates its database."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

logger = logging.getLogger(__name__)


def document_job_counts(directory: Path) -> dict[str, tuple[int, int]]:
    """State -> (jobs, sentences not yet translated); empty before the first job, and when
    the file cannot be read now (the next scrape tries again)."""
    path = directory / "documents.sqlite3"
    if not path.exists():
        return {}
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        ) as db:
            rows = db.execute(
                "SELECT status, COUNT(*), SUM(MAX(sentences_total - sentences_done, 0)) "
                "FROM document_jobs GROUP BY status"
            ).fetchall()
    except sqlite3.Error as error:
        logger.warning("document job counts unreadable: %s", error)
        return {}
    return {status: (jobs, left or 0) for status, jobs, left in rows}
