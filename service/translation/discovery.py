"""Which models the settings name: the exports and the installed models, read from each
export's ``config.json`` alone, so nothing is loaded at start-up that is not served.

An export declares its pair (``source_lang`` / ``target_lang``; exports from before the field
existed fall back to the tokenizer's config), or, multilingual (M2M-100, NLLB-200), a set of
``languages`` of which it serves every pair. Two models for one pair are refused at start-up
rather than one silently shadowing the other; a model of one pair wins that pair over a
multilingual one, and where two multilingual models share a pair the one configured first
serves it. An installed model (``MT_MODELS_DIR``) replaces an export of its pair, as a pulled
model replaces a shipped one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from service.translation.exports import ModelSpec, model_spec
from service.translation.languages import normalise_language_code
from service.translation.model_settings import DEFAULT_EXPORT

logger = logging.getLogger(__name__)


class RegistryError(Exception):
    """The configured models cannot be served (none found, or two for one pair)."""


def discover_models(
    exports: Sequence[Path],
    models_dir: Path | None,
    served_model_name: str = "",
    load_only: Sequence[str] = (),
) -> list[ModelSpec]:
    """The models the settings name: ``exports`` and the sub-directories of ``models_dir``
    that hold a ``config.json`` (an installed model replaces an export of its pair, as a
    pulled model replaces a shipped one); the default export when both are empty. A model
    served alone is named ``served_model_name`` if given. ``load_only``: only the models of
    those languages."""
    installed: list[Path] = []
    if models_dir is not None:
        root = Path(models_dir)
        if not root.is_dir():
            raise RegistryError(f"MT_MODELS_DIR={root} is not a directory")
        # Hidden entries are pulls in progress (service/models_cli/store.py).
        installed = sorted(
            sub
            for sub in root.iterdir()
            if not sub.name.startswith(".") and (sub / "config.json").is_file()
        )
    if not exports and not installed:
        exports = [DEFAULT_EXPORT]
    alone = len(exports) == 1 and not installed
    given = [model_spec(Path(path), served_model_name if alone else "") for path in exports]
    pulled = [model_spec(directory, "") for directory in installed]
    replaced = {spec.pair for spec in pulled if not spec.multilingual}
    for spec in given:
        if not spec.multilingual and spec.pair in replaced:
            logger.info("%s→%s: serving the installed model, not %s", *spec.pair, spec.model_dir)
    specs = [s for s in given if s.multilingual or s.pair not in replaced] + pulled
    for kind, key in (("name", lambda s: s.model_id), ("language pair", lambda s: s.pair)):
        seen: dict[object, ModelSpec] = {}
        for spec in specs:
            if kind == "language pair" and spec.multilingual:
                continue  # overlapping multilingual models are resolved in serving_pairs
            if (other := seen.setdefault(key(spec), spec)) is not spec:
                raise RegistryError(
                    f"two models with the {kind} {key(spec)}: {other.model_dir} and "
                    f"{spec.model_dir}"
                )
    if not specs:
        raise RegistryError("no models configured")
    return only_languages(specs, load_only) if load_only else specs


def only_languages(specs: Sequence[ModelSpec], languages: Sequence[str]) -> list[ModelSpec]:
    """The models that serve only ``languages`` (MT_LOAD_ONLY): a model of one pair when
    both of its languages are listed, a multilingual model cut down to the listed ones."""
    wanted = {normalise_language_code(code) for code in languages}
    kept = []
    for spec in specs:
        if spec.multilingual:
            codes = tuple(code for code in spec.languages if code in wanted)
            if len(codes) >= 2:
                kept.append(
                    replace(spec, source_lang=codes[0], target_lang=codes[1], languages=codes)
                )
        elif {normalise_language_code(code) for code in spec.pair} <= wanted:
            kept.append(spec)
    if not kept:
        served = sorted({code for spec in specs for pair in spec.pairs() for code in pair})
        raise RegistryError(
            f"MT_LOAD_ONLY={','.join(languages)} leaves no model to serve; the configured "
            f"models serve {', '.join(served)}"
        )
    return kept


def serving_pairs(specs: Sequence[ModelSpec]) -> dict[tuple[str, str], str]:
    """(source, target) -> the model id that serves it: models of one pair first, then each
    multilingual model, in the configured order, for the pairs still free."""
    by_pair = {spec.pair: spec.model_id for spec in specs if not spec.multilingual}
    for spec in specs:
        if spec.multilingual:
            for pair in spec.pairs():
                by_pair.setdefault(pair, spec.model_id)
    return by_pair
