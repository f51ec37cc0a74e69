"""Our save format: one directory with ``config.json`` (a TransformerConfig plus ``"format":
"mtserve"``), ``model.safetensors``, and the tokenizer files in the Marian layout
(``source.spm``, ``target.spm``, ``vocab.json``), so one tokenizer code path serves both.

Writing it needs no importer: the Marian and M2M-100 importers (models/marian.py,
models/m2m100.py) write their conversions with ``save_pretrained``, and models/checkpoint.py
reads any checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_model

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
