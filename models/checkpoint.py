"""Loading a checkpoint: our save format (models/save_format.py, whose writers this module
re-exports) or a Hugging Face Marian (OPUS-MT) or M2M-100 / NLLB directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_model

from models.config import TransformerConfig
from models.save_format import (
    FORMAT_NAME,
    TOKENIZER_FILES,
    copy_tokenizer_files,
    language_pair,
    save_pretrained,
)
from models.transformer import Transformer

__all__ = [
    "FORMAT_NAME",
    "TOKENIZER_FILES",
    "copy_tokenizer_files",
    "hf_model_type",
    "is_marian_dir",
    "language_pair",
    "load_pretrained",
    "save_pretrained",
]


def hf_model_type(model_dir: str | Path) -> str | None:
    """The ``model_type`` of a Hugging Face directory's config.json; None for our format."""
    return json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")


def is_marian_dir(model_dir: str | Path) -> bool:
    return hf_model_type(model_dir) == "marian"


def load_pretrained(model_dir: str | Path) -> Transformer:
    """Load our format or a Hugging Face Marian or M2M-100 / NLLB directory, in eval mode."""
    model_dir = Path(model_dir)
    model_type = hf_model_type(model_dir)
    if model_type == "marian":
        from models.marian import load_marian

        return load_marian(model_dir)
    if model_type == "m2m_100":  # NLLB-200 checkpoints declare it too
        from models.m2m100 import load_m2m100

        return load_m2m100(model_dir)
    if model_type is not None:
        raise ValueError(f"{model_dir}: unsupported model_type {model_type!r}")
    config = TransformerConfig.load(model_dir / "config.json")
    model = Transformer(config)
    load_model(model, str(model_dir / "model.safetensors"))
    return model.eval()
