"""Building a served export from a downloaded checkpoint (export/checkpoint_build.py), with
a progress bar over its stages.

This is the one part of ``python -m service models`` that needs the export extras (torch,
onnx): it imports the exporter only when a pull builds, so nothing under service/ imports
torch, and serving needs none of them.
"""

from __future__ import annotations

import errno
import importlib.util
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.models_cli.errors import ModelsError
from service.models_cli.hub import disk_full
from service.runtime.contract import Variant


def require_export_extras() -> None:
    """Refuse a pull before any download when the exporter's packages are missing (found
    without importing them)."""
    missing = [name for name in ("torch", "onnx") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelsError(
            f"pulling a model needs the export extras ({missing[0]} is missing): "
            "pip install -e '.[export]' (`make venv` installs them); serving needs none of them"
        )


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


def build_export(
    checkpoint: Path,
    staging: Path,
    name: str,
    variant: Variant,
    pair: tuple[str, str] | None,
) -> Path:
    """The export of ``checkpoint`` as ``name``, written below ``staging``; its directory."""
    require_export_extras()
    # The exporter is torch's side of the project: imported only here, never by the service.
    from export.checkpoint_build import BuildRefused, build_from_checkpoint, stages_for

    progress = StageProgress(stages_for(variant), name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the dynamo exporter's axis-renaming chatter
            return build_from_checkpoint(checkpoint, staging, name, variant, pair, progress.stage)
    except BuildRefused as error:
        raise ModelsError(str(error)) from error
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise disk_full(error) from error
        raise
    finally:
        progress.close()
