"""A Hugging Face Hub cache built by hand, in the Hub's own layout
(``models--ORG--NAME/snapshots/<commit>/``, ``refs/main``), which ``huggingface_hub`` reads
offline (``HF_HUB_OFFLINE=1``) as it would a cache it filled itself."""

from __future__ import annotations

import shutil
from pathlib import Path


def repo_folder(cache: Path, hub_id: str) -> Path:
    return cache / f"models--{hub_id.replace('/', '--')}"


def seed(cache: Path, hub_id: str, files: Path, commit: str) -> Path:
    """Put ``files`` in the cache as ``hub_id`` at ``commit`` and point ``main`` at it."""
    folder = repo_folder(cache, hub_id)
    shutil.copytree(files, folder / "snapshots" / commit)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return folder / "snapshots" / commit


def use_offline(monkeypatch, cache: Path) -> None:
    """huggingface_hub reads its cache and offline mode from these, at call time."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def pull_offline(cache: Path, models_dir: Path, name: str) -> Path:
    """``python -m service models pull NAME`` into ``models_dir`` from ``cache`` alone (for
    module-scoped fixtures, which cannot use monkeypatch)."""
    from huggingface_hub import constants

    from service.models_cli import main as models_main

    saved = constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = str(cache), True
    try:
        assert models_main(["--models-dir", str(models_dir), "pull", name]) == 0
    finally:
        constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = saved
    return models_dir
