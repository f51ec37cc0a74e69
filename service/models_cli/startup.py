"""Models at start-up: ``MT_MODELS=opus-mt-en-fr,...`` pulls whatever is not installed before
any model loads, as TGI's launcher downloads ``--model-id`` before its shards start.

As in TGI, a failed download stops the start-up (``python -m service`` logs one line and exits
with status 1) rather than serving less than was asked for: an orchestrator then shows the
failure, and restarts retry the pull. ``python -m service models sync`` runs the same pulls on
their own (a Kubernetes init container).

The models directory is created when it is configured and missing (a fresh volume), so that a
server pointed at an empty volume serves its other models instead of refusing to start.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from service.config import Settings
from service.models_cli.catalog import resolve
from service.models_cli.hub import Downloader, HubDownloader
from service.models_cli.pull import Puller
from service.models_cli.store import ModelStore

logger = logging.getLogger(__name__)


def default_models_dir(settings: Settings) -> Path:
    """Where pulled models live: MT_MODELS_DIR, else MT_DATA_DIR/models."""
    return settings.model.models_dir or settings.storage.data_dir / "models"


def pull_missing(
    settings: Settings,
    downloader: Downloader | None = None,
    say: Callable[[str], None] = logger.info,
) -> list[str]:
    """Pull every ``MT_MODELS`` name whose install is missing (fp32, the revision on the Hub's
    ``main``); the names pulled. ``ModelsError`` (or the build's error) on the first failure,
    after which nothing of that model is installed."""
    store = ModelStore(default_models_dir(settings))
    puller = Puller(store, downloader or HubDownloader(), say)
    sources = [resolve(name) for name in settings.model.models]  # every name, before a pull
    pulled = []
    for name, source in zip(settings.model.models, sources, strict=True):
        if store.get(source.name) is not None:
            say(f"{source.name} is installed in {store.root}")
            continue
        say(f"pulling {name} into {store.root} (MT_MODELS)")
        puller.install(source, None, "fp32")
        pulled.append(source.name)
    return pulled


def startup_settings(settings: Settings, downloader: Downloader | None = None) -> Settings:
    """The settings to serve with, after ``MT_MODELS``' pulls: the models directory created
    where it is configured and missing, and set to the pulls' directory where they ran."""
    if settings.model.models:
        pull_missing(settings, downloader)
        settings = settings.replace(models_dir=default_models_dir(settings))
    if (models_dir := settings.model.models_dir) is not None and not models_dir.exists():
        with contextlib.suppress(OSError):  # read-only: discovery then says it is missing
            models_dir.mkdir(parents=True)
            logger.info("created the models directory %s (MT_MODELS_DIR)", models_dir)
    return settings
