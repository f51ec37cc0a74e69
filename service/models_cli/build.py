"""Building a served export from a downloaded checkpoint, in stages with a progress bar:
import (models/marian.py, models/m2m100.py), ONNX export (export/onnx_export.py), a parity
check of greedy decodes against PyTorch (export/verify.py), and the int8 or fp16 variant
(export/variants.py).

This is the one part of ``python -m service models`` that needs the export extras (torch,
onnx); the service itself never imports it.
"""

from __future__ import annotations

import errno
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from service.models_cli.errors import ModelsError
from service.models_cli.hub import disk_full

Variant = Literal["fp32", "int8", "fp16"]
# Source lengths of the parity check's sentences (random ids, as export/verify.py makes them).
PARITY_LENGTHS = [5, 9, 12, 7]
PARITY_MAX_NEW_TOKENS = 16


def require_export_extras() -> None:
    try:
        import onnx  # noqa: F401
        import torch  # noqa: F401
    except ImportError as error:
        raise ModelsError(
            f"pulling a model needs the export extras ({error.name} is missing): "
            "pip install -e '.[export]' (`make venv` installs them); serving needs none of them"
        ) from error


class StageProgress:
    """One bar over a pull's stages, on stderr; the current stage is its label."""

    def __init__(self, stages: list[str], label: str) -> None:
        from tqdm import tqdm

        self._bar: Any = tqdm(total=len(stages), desc=label, unit="stage", leave=True)
        self._label = label

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._bar.set_description(f"{self._label}: {name}")
        yield
        self._bar.update(1)

    def close(self) -> None:
        self._bar.set_description(self._label)
        self._bar.close()


def stages_for(variant: Variant) -> list[str]:
    return ["import", "export", "parity", *([variant] if variant != "fp32" else [])]


def build_export(
    checkpoint: Path,
    staging: Path,
    name: str,
    variant: Variant,
    pair: tuple[str, str] | None,
) -> Path:
    """The export of ``checkpoint`` as ``name``, written below ``staging``; its directory."""
    require_export_extras()
    progress = StageProgress(stages_for(variant), name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the dynamo exporter's axis-renaming chatter
            return _build(checkpoint, staging, name, variant, pair, progress)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise disk_full(error) from error
        raise
    finally:
        progress.close()


def _build(
    checkpoint: Path,
    staging: Path,
    name: str,
    variant: Variant,
    pair: tuple[str, str] | None,
    progress: StageProgress,
) -> Path:
    from export.onnx_export import export_model
    from export.variants import make_fp16, make_int8
    from export.verify import decode_agreement
    from models.checkpoint import load_pretrained

    with progress.stage("import"):
        try:
            model = load_pretrained(checkpoint)
        except (ValueError, KeyError) as error:
            raise ModelsError(f"{name} cannot be imported: {error}") from error
    fp32 = staging / "fp32"
    with progress.stage("export"):
        export_model(model, fp32, tokenizer_dir=checkpoint, model_name=name, languages=pair)
    with progress.stage("parity"):
        agreement = decode_agreement(
            model, fp32, PARITY_LENGTHS, beam_sizes=(1,), max_new_tokens=PARITY_MAX_NEW_TOKENS
        )
        if agreement["beam1"] < 1.0:
            raise ModelsError(
                f"the export of {name} does not decode as the checkpoint does "
                f"({agreement['beam1']:.0%} of {len(PARITY_LENGTHS)} greedy decodes identical); "
                "nothing was installed"
            )
    if variant == "int8":
        with progress.stage("int8"):
            return make_int8(fp32, staging / "int8")
    if variant == "fp16":
        with progress.stage("fp16"):
            return make_fp16(fp32, staging / "fp16")
    return fp32
