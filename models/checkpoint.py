"""Our save format, and loading it or a Hugging Face Marian (OPUS-MT) or M2M-100 / NLLB directory.

Our format is one directory: ``config.json`` (a TransformerConfig plus ``"format": "mtserve"``),
``model.safetensors``, and the tokenizer files in the Marian layout (``source.spm``,
``target.spm``, ``vocab.json``), so one tokenizer code path serves both.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_model, save_model

from models.config import TransformerConfig
from models.transformer import Transformer

FORMAT_NAME = "mtserve"
TOKENIZER_FILES = (
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "sentencepiece.bpe.model",  # NLLB-200 (service/text/tokenizer.py, NllbTokenizer)
    "special_tokens_map.json",
)


def copy_tokenizer_files(source_dir: str | Path, output_dir: str | Path) -> list[str]:
    """Copy whichever tokenizer files exist (Marian or NLLB layout); returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(source_dir) / name).exists():
            shutil.copyfile(Path(source_dir) / name, Path(output_dir) / name)
            copied.append(name)
    return copied


def language_pair(model_dir: str | Path) -> dict[str, str]:
    """``{"source_lang", "target_lang"}`` that a checkpoint's tokenizer config declares
    (Marian and our own layout); empty when it declares none."""
    try:
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    pair = {key: config.get(key) for key in ("source_lang", "target_lang")}
    if all(isinstance(code, str) and code for code in pair.values()):
        return {key: code.lower() for key, code in pair.items()}
    return {}


def save_pretrained(
    model: Transformer, output_dir: str | Path, tokenizer_dir: str | Path | None = None
) -> None:
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT_NAME, **model.config.to_dict()}
    (output_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_model(model, str(output_dir / "model.safetensors"))  # de-duplicates tied weights
    if tokenizer_dir is not None and Path(tokenizer_dir).resolve() != output_dir.resolve():
        copy_tokenizer_files(tokenizer_dir, output_dir)


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
