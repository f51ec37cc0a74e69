"""Downloads from the Hugging Face Hub: ``huggingface_hub.snapshot_download`` with only the
files a pull needs (``allow_patterns``), into the Hub's own cache (``HF_HOME`` /
``HF_HUB_CACHE``), which works offline (``HF_HUB_OFFLINE=1``) from what is cached.

Every failure of the Hub becomes one sentence (``ModelsError``): no network, an unknown
repository or revision, a gated repository, a full disk.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from service.models_cli.errors import ModelsError


class Downloader(Protocol):
    """What a pull needs of the Hub (tests give a fake)."""

    def snapshot(self, hub_id: str, revision: str | None, patterns: Sequence[str]) -> Path:
        """The local snapshot directory of ``hub_id`` at ``revision`` (None: main) holding the
        repository's files that match ``patterns``; its name is the resolved commit."""
        ...

    def files(self, hub_id: str, revision: str) -> list[str] | None:
        """The repository's file names at a commit; None when the Hub cannot be asked."""
        ...


class HubDownloader:
    """The Hugging Face Hub through ``huggingface_hub`` (its progress bars on stderr)."""

    def snapshot(self, hub_id: str, revision: str | None, patterns: Sequence[str]) -> Path:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(hub_id, revision=revision, allow_patterns=list(patterns)))
        except Exception as error:
            raise hub_error(error, hub_id, revision) from error

    def files(self, hub_id: str, revision: str) -> list[str] | None:
        from huggingface_hub import HfApi, is_offline_mode

        if is_offline_mode():
            return None
        try:
            return HfApi().list_repo_files(hub_id, revision=revision)
        except Exception:
            return None  # the snapshot shows what is there


def hub_error(error: Exception, hub_id: str, revision: str | None) -> ModelsError:
    """The sentence for a failed download."""
    from huggingface_hub import errors

    at = f" at revision {revision!r}" if revision else ""
    if isinstance(error, errors.GatedRepoError):
        return ModelsError(
            f"{hub_id} is a gated repository: accept its terms on https://huggingface.co/"
            f"{hub_id} and log in (`hf auth login` or HF_TOKEN), then pull again"
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return ModelsError(f"{hub_id} has no revision {revision!r}")
    if isinstance(error, errors.RepositoryNotFoundError):
        return ModelsError(
            f"{hub_id} is not a model on the Hugging Face Hub (or it is private: log in first)"
        )
    if isinstance(error, errors.LocalEntryNotFoundError):
        return ModelsError(
            f"{hub_id}{at} is not in the local Hugging Face cache and the Hub cannot be reached "
            "(no network, or HF_HUB_OFFLINE=1); connect, or pull on a machine that can and "
            "copy its HF_HOME"
        )
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return disk_full(error)
    return ModelsError(f"downloading {hub_id}{at} failed: {type(error).__name__}: {error}")


def disk_full(error: OSError) -> ModelsError:
    where = Path(error.filename) if error.filename else Path.cwd()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free / 1e9
    return ModelsError(f"the disk is full ({free:.1f} GB free under {where}); free some space")
