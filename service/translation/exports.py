"""What an export directory says about itself, read without loading it: the model it is
(``ModelSpec``: its id and languages, from ``config.json``), the size of its ONNX files and,
for a model installed by ``python -m service models pull``, the Hub revision its
``manifest.json`` records (the registry reloads a loaded model whose revision changed).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from service.translation.languages import normalise_language_code

logger = logging.getLogger(__name__)

# Written beside an installed export by service/models_cli/store.py.
MANIFEST_FILE = "manifest.json"
DEFAULT_PAIR = ("en", "de")  # exports that declare no languages (the first shipped model)


@dataclass(frozen=True)
class ModelSpec:
    model_id: str
    model_dir: Path
    source_lang: str
    target_lang: str
    # A multilingual model's languages (canonical codes): it serves every pair of them, and
    # source_lang / target_lang are only the first two. Empty: a model of one pair.
    languages: tuple[str, ...] = ()

    @property
    def pair(self) -> tuple[str, str]:
        return self.source_lang, self.target_lang

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)

    def pairs(self) -> list[tuple[str, str]]:
        """Every (source, target) the model translates."""
        if not self.languages:
            return [self.pair]
        return [(s, t) for s in self.languages for t in self.languages if s != t]


def read_export_languages(model_dir: Path) -> tuple[str, ...]:
    """The canonical codes of the languages a multilingual export declares (config.json's
    ``languages``, as its tokenizer spells them); () for a model of one pair."""
    try:
        declared = json.loads((model_dir / "config.json").read_text()).get("languages")
    except (OSError, ValueError, AttributeError):
        return ()
    if not isinstance(declared, list):
        return ()
    codes = [normalise_language_code(code) for code in declared if isinstance(code, str)]
    return tuple(dict.fromkeys(code for code in codes if code))


def read_export_config(model_dir: Path) -> tuple[str | None, tuple[str, str] | None]:
    """``(model_name, (source, target))`` declared by an export; None where it says nothing."""
    name, pair = None, None
    for file_name in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((model_dir / file_name).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(config, dict):
            continue
        name = name or config.get("model_name") or None
        source, target = config.get("source_lang"), config.get("target_lang")
        if (
            pair is None
            and isinstance(source, str)
            and isinstance(target, str)
            and source
            and target
        ):
            pair = (source.lower(), target.lower())
    return name, pair


def onnx_bytes(model_dir: Path) -> int:
    """Bytes of the export's ONNX graphs and weights (what the sessions load)."""
    try:
        return sum(path.stat().st_size for path in model_dir.iterdir() if ".onnx" in path.name)
    except OSError:
        return 0


def installed_revision(model_dir: Path) -> str | None:
    """The Hub commit an installed model's files came from; None for an export made by hand
    (no manifest) or a manifest that cannot be read (a swap under way reads it again later)."""
    try:
        revision = json.loads((model_dir / MANIFEST_FILE).read_text()).get("revision")
    except (OSError, ValueError, AttributeError):
        return None
    return revision if isinstance(revision, str) and revision else None


def model_spec(directory: Path, model_name: str) -> ModelSpec:
    """The spec an export's config declares (``model_name``, if given, names it)."""
    name, pair = read_export_config(directory)
    model_id = model_name or name or directory.name
    languages = read_export_languages(directory)
    if len(languages) >= 2:
        return ModelSpec(model_id, directory, languages[0], languages[1], languages)
    if pair is None:
        logger.warning("%s declares no source_lang/target_lang; assuming en→de", directory)
        pair = DEFAULT_PAIR
    return ModelSpec(model_id, directory, *pair)
