"""The models and settings a batch translates with: the models the settings name, as the server
finds them, else ``make serve``'s (the shipped exports and the installed models), and the
settings without what guards a server's other clients.
"""

from __future__ import annotations

from pathlib import Path

from service.config import Settings
from service.models_cli.startup import default_models_dir
from service.translation.discovery import discover_models
from service.translation.exports import ModelSpec

# No request deadline: a file of any length is one job (the settings' limit is a server's).
NO_DEADLINE_S = 30 * 24 * 3600.0
# Where `make onnx` writes the shipped models' exports (the models under models/), relative
# to the working directory or to the checkout this package runs from.
SHIPPED_EXPORTS = Path("build/onnx")


def shipped_exports(root: Path | None = None) -> list[Path]:
    """The shipped models' exports, as ``make serve`` serves them: ``build/onnx/NAME`` for
    every ``models/NAME`` with weights, exported (other exports there, such as an int8
    variant, are not shipped models); under ``root``, else the working directory, else
    this checkout."""
    roots = [root] if root is not None else [Path.cwd(), Path(__file__).resolve().parents[2]]
    for base in roots:
        found = sorted(
            base / SHIPPED_EXPORTS / weights.parent.name
            for weights in base.glob("models/*/model.safetensors")
            if (base / SHIPPED_EXPORTS / weights.parent.name / "decoder.onnx").is_file()
        )
        if found:
            return found
    return []


def model_specs(settings: Settings) -> list[ModelSpec]:
    """The models to translate with: those the settings name (``MT_EXPORTS``,
    ``MT_MODELS_DIR``), as the server finds them; where they name none,
    ``make serve``'s: the shipped exports and the installed models. ``RegistryError`` when
    there are none."""
    model = settings.model
    named = {"exports", "models_dir"} & model.model_fields_set
    if named:
        return discover_models(
            model.exports, model.models_dir, model.served_model_name, model.load_only
        )
    installed = default_models_dir(settings)
    has_installed = installed.is_dir() and any(installed.glob("*/config.json"))
    return discover_models(
        shipped_exports(),
        installed if has_installed else None,
        model.served_model_name,
        model.load_only,
    )


def batch_settings(settings: Settings) -> Settings:
    """``settings`` without what guards a server's other clients: no request deadline and a
    queue that takes every chunk in flight (the batching and the model settings stay)."""
    return settings.replace(request_timeout_s=NO_DEADLINE_S, max_queue=1 << 30)
