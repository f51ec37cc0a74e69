"""The storage settings: where the state that outlives a request is kept (``MT_DATA_DIR`` or
``MT_DATABASE_URL``), and how long document jobs and translated files stay. service/config.py
reads them from the environment as part of ``Settings``."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class StorageSettings(BaseModel):
    """Files, documents and what is kept across restarts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path = Field(
        Path("data"),
        description="Where stored glossaries, translation memories, usage counts "
        "(SQLite, mtserve.sqlite3), document jobs with their files (documents.sqlite3) and the "
        "front-ends' rate-limit windows (limits.sqlite3) live, kept across restarts; created at "
        "start-up, which checks that it can be written (/ready says 503 and why when not). "
        "Unused when database_url is set.",
    )
    database_url: str | None = Field(
        None,
        pattern=r"^(postgres(ql)?://.*)?$",
        description="A PostgreSQL database (postgresql://user:password@host:5432/name) that "
        "holds glossaries, memories, document jobs, usage counts and rate limits instead of "
        "the SQLite files under data_dir: every replica given the same URL serves one state "
        "(docs/deployment.md). Unset or empty: SQLite, for one process.",
    )
    document_lease_s: float = Field(
        30.0,
        ge=1.0,
        description="How long a document job stays claimed by a replica without word from it; "
        "a job whose replica died is taken up by another within about this long.",
    )
    files_translation: bool = Field(
        True, description="Serve POST /translate_file and /download_file (LibreTranslate's)."
    )
    files_dir: Path = Field(
        Path(tempfile.gettempdir()) / "mtserve-files",
        description="Where translated files wait for their download.",
    )
    files_ttl_s: float = Field(
        1800.0,
        gt=0,
        description="Translated files older than this are deleted (LibreTranslate: 30 min).",
    )
    document_jobs: int = Field(
        1,
        ge=1,
        description="Document jobs (POST /v1/documents, DeepL's /v2/document) translated at "
        "once; each sends its sentences to the translator a few at a time, so interactive "
        "requests are not queued behind a document.",
    )
    document_ttl_s: float = Field(
        86400.0,
        gt=0,
        description="Finished document jobs (their upload and result) older than this are "
        "deleted (checked whenever a job is created).",
    )
