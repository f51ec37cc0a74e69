"""The models directory (``MT_MODELS_DIR``): what is installed, each install's manifest, and
installing and removing atomically.

Each model is one export directory, served as it is (service/translation/registry.py reads
every sub-directory with a ``config.json``), plus ``manifest.json``: where it came from (Hub
id, requested and resolved revision), its licence, languages and variant, and the sha256 of
every file. A pull builds in ``.partial/`` inside the directory (the same filesystem, so the
final step is a rename) and only renames a finished export into place: an interrupted or
failed pull leaves nothing that is served.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from service.models_cli.errors import ModelsError
from service.translation.exports import MANIFEST_FILE

PARTIAL_DIR = ".partial"


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` holds about one install."""

    name: str
    hub_id: str
    revision: str  # the commit the files came from
    requested_revision: str | None  # what the user asked for (None: main); update follows it
    architecture: str
    languages: list[str]
    variant: str
    licence: str
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    pulled_at: str = ""

    def write(self, directory: Path) -> None:
        (directory / MANIFEST_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, directory: Path) -> Manifest | None:
        try:
            data = json.loads((directory / MANIFEST_FILE).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


@dataclass(frozen=True)
class InstalledModel:
    """One served directory: its name, languages, size, and the manifest where it has one."""

    name: str
    directory: Path
    languages: list[str]
    variant: str
    size_bytes: int
    manifest: Manifest | None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file below ``directory`` (the manifest aside), by relative path."""
    return {
        str(path.relative_to(directory)): sha256_of(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MANIFEST_FILE
    }


def export_languages(directory: Path) -> list[str]:
    """The languages an export's config.json declares: a multilingual model's list, else its
    pair."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return []
    if isinstance(config.get("languages"), list):
        return [str(code) for code in config["languages"]]
    return [str(config[key]) for key in ("source_lang", "target_lang") if config.get(key)]


def directory_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


class ModelStore:
    """The installed models under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def installed(self) -> list[InstalledModel]:
        if not self.root.is_dir():
            return []
        found = []
        for directory in sorted(self.root.iterdir()):
            if directory.name.startswith(".") or not (directory / "config.json").is_file():
                continue
            manifest = Manifest.read(directory)
            try:
                config = json.loads((directory / "config.json").read_text())
            except (OSError, ValueError):
                config = {}
            variant = manifest.variant if manifest else str(config.get("variant", "fp32"))
            found.append(
                InstalledModel(
                    directory.name,
                    directory,
                    export_languages(directory),
                    variant,
                    directory_bytes(directory),
                    manifest,
                )
            )
        return found

    def get(self, name: str) -> InstalledModel | None:
        return next((model for model in self.installed() if model.name == name), None)

    @contextmanager
    def staging(self, name: str) -> Iterator[Path]:
        """An empty directory to build ``name`` in, removed afterwards whatever happens (with
        the directories made for it, so a failed pull leaves the models directory as it
        was)."""
        made = [path for path in (self.root, self.root / PARTIAL_DIR) if not path.exists()]
        (self.root / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root / PARTIAL_DIR))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            for directory in [self.root / PARTIAL_DIR, *reversed(made)]:
                if directory.exists() and not any(directory.iterdir()):
                    directory.rmdir()

    def install(self, built: Path, name: str) -> Path:
        """Move a finished export into place as ``name``, replacing an older one: the old
        directory is renamed aside first, then the new one renamed in."""
        target = self.root / name
        if not target.exists():
            os.rename(built, target)
            return target
        retired = Path(tempfile.mkdtemp(prefix=f"{name}-old-", dir=self.root / PARTIAL_DIR))
        os.rename(target, retired / name)
        try:
            os.rename(built, target)
        except OSError:
            os.rename(retired / name, target)  # put the old one back
            raise
        shutil.rmtree(retired, ignore_errors=True)
        return target

    def remove(self, name: str) -> None:
        installed = self.get(name)
        if installed is None:
            names = ", ".join(model.name for model in self.installed()) or "none"
            raise ModelsError(f"{name} is not installed in {self.root} (installed: {names})")
        # Renamed aside first: a server that starts meanwhile never sees half a model.
        with self.staging(f"{name}-removed") as aside:
            os.rename(installed.directory, aside / name)
