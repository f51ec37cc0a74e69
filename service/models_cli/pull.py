"""``pull`` and ``update``: a name to an installed, verified export with its manifest.

A pull fetches the configuration, model card and tokenizer first, checks that the
checkpoint is one this service imports (before gigabytes of weights), then fetches the
weights (safetensors where the repository has them), builds the export in the store's
staging directory and renames it into place. An update asks the Hub for the revision the
install followed and pulls again only when it moved.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from service.models_cli.build import build_export, require_export_extras
from service.models_cli.catalog import (
    METADATA_FILES,
    REQUIRED_TOKENIZER,
    SHARDED_INDEXES,
    SUPPORTED,
    WEIGHT_FILES,
    ModelSource,
    resolve,
)
from service.models_cli.errors import ModelsError
from service.models_cli.hub import Downloader
from service.models_cli.store import Manifest, ModelStore, export_languages, file_hashes
from service.runtime.contract import Variant

logger = logging.getLogger(__name__)


def model_card_licence(snapshot: Path) -> str:
    """The ``license`` of the model card's metadata (README.md front matter); ``unknown``."""
    try:
        from huggingface_hub.repocard import metadata_load

        metadata = metadata_load(snapshot / "README.md") or {}
    except Exception:  # no card, or a card whose YAML does not parse
        return "unknown"
    licence = metadata.get("license")
    return str(licence) if licence else "unknown"


def check_checkpoint(snapshot: Path, hub_id: str) -> str:
    """The checkpoint's architecture, after checking that it is one this service imports and
    that its tokenizer is there; ``ModelsError`` otherwise."""
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        raise ModelsError(f"{hub_id} has no readable config.json: not a model checkpoint") from None
    architecture = config.get("model_type") if isinstance(config, dict) else None
    if architecture not in REQUIRED_TOKENIZER:
        raise ModelsError(f"{hub_id} is a {architecture!r} model; this service imports {SUPPORTED}")
    if missing := [
        name for name in REQUIRED_TOKENIZER[architecture] if not (snapshot / name).exists()
    ]:
        raise ModelsError(f"{hub_id} has no tokenizer: {', '.join(missing)} missing")
    if sharded := [name for name in SHARDED_INDEXES if (snapshot / name).exists()]:
        raise ModelsError(
            f"{hub_id} is sharded ({sharded[0]}); sharded checkpoints are not imported yet"
        )
    return str(architecture)


class Puller:
    """Pulls and updates models into one store."""

    def __init__(
        self, store: ModelStore, downloader: Downloader, say: Callable[[str], None] = print
    ) -> None:
        self.store = store
        self.downloader = downloader
        self.say = say

    def pull(self, name: str, revision: str | None = None, variant: Variant = "fp32") -> Path:
        """Install ``name`` (an alias or Hub id) unless that revision and variant is installed
        already; the install's directory."""
        return self.install(resolve(name), revision, variant)

    def install(self, source: ModelSource, revision: str | None, variant: Variant) -> Path:
        metadata = self.downloader.snapshot(source.hub_id, revision, METADATA_FILES)
        commit = metadata.name
        installed = self.store.get(source.name)
        if installed and installed.manifest:
            held = installed.manifest
            if held.hub_id == source.hub_id and held.revision == commit and held.variant == variant:
                self.say(f"{source.name} is installed already (revision {commit[:12]}, {variant})")
                return installed.directory
        architecture = check_checkpoint(metadata, source.hub_id)
        require_export_extras()
        snapshot = self._with_weights(source, commit)
        with self.store.staging(source.name) as staging:
            built = build_export(snapshot, staging, source.name, variant, source.pair)
            languages = export_languages(built)
            if len(languages) < 2:
                raise ModelsError(
                    f"{source.hub_id} declares no language pair (its tokenizer_config.json has "
                    "no source_lang and target_lang); nothing was installed"
                )
            licence = model_card_licence(snapshot)
            Manifest(
                name=source.name,
                hub_id=source.hub_id,
                revision=commit,
                requested_revision=revision,
                architecture=architecture,
                languages=languages,
                variant=variant,
                licence=licence,
                files=file_hashes(built),
                pulled_at=datetime.now(UTC).isoformat(timespec="seconds"),
            ).write(built)
            target = self.store.install(built, source.name)
        self.say(
            f"installed {source.name} ({describe_languages(languages)}, {variant}, revision "
            f"{commit[:12]}, licence {licence}) in {target}"
        )
        if "nc" in licence.lower().split("-"):
            self.say(f"note: {source.name}'s licence ({licence}) forbids commercial use")
        return target

    def _with_weights(self, source: ModelSource, commit: str) -> Path:
        listed = self.downloader.files(source.hub_id, commit)
        wanted = (
            [next((w for w in WEIGHT_FILES if w in listed), WEIGHT_FILES[0])]
            if listed
            else list(WEIGHT_FILES)
        )
        snapshot = self.downloader.snapshot(source.hub_id, commit, [*METADATA_FILES, *wanted])
        if not any((snapshot / name).exists() for name in WEIGHT_FILES):
            raise ModelsError(
                f"{source.hub_id} at {commit[:12]} has no weights ({' or '.join(WEIGHT_FILES)})"
            )
        return snapshot

    def update(self, name: str | None = None) -> list[str]:
        """Re-pull each installed model (or ``name``) whose revision moved on the Hub; the
        names re-pulled. The old install serves until the new one is renamed into place."""
        installs = self.store.installed()
        if name is not None:
            wanted = {name}
            with contextlib.suppress(ModelsError):
                wanted.add(resolve(name).name)  # an alias or Hub id names its install too
            installs = [model for model in installs if model.name in wanted]
            if not installs:
                raise ModelsError(f"{name} is not installed in {self.store.root}")
        updated = []
        for model in installs:
            held = model.manifest
            if held is None:
                self.say(f"{model.name}: exported by hand (no manifest), left as it is")
                continue
            latest = self.downloader.snapshot(held.hub_id, held.requested_revision, ["config.json"])
            if latest.name == held.revision:
                self.say(f"{model.name} is up to date (revision {held.revision[:12]})")
                continue
            self.say(f"{model.name}: revision {held.revision[:12]} -> {latest.name[:12]}")
            variant = cast(Variant, held.variant)
            self.install(ModelSource(held.hub_id, model.name), held.requested_revision, variant)
            updated.append(model.name)
        return updated


def describe_languages(languages: list[str]) -> str:
    if len(languages) == 2:
        return "→".join(languages)
    return f"{len(languages)} languages"
