"""Model names: the aliases ``python -m service models`` knows (``opus-mt-en-fr``,
``nllb-200-distilled-600M``, ...), how a name becomes a Hugging Face Hub id and an install
name, and which of a repository's files a pull needs.

An install is named after the repository (``Helsinki-NLP/opus-mt-en-fr`` and ``opus-mt-en-fr``
install the same ``opus-mt-en-fr``), so pulling by alias or by id gives one model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.models_cli.errors import ModelsError

# Every OPUS-MT pair of two language codes is an alias: Helsinki-NLP publishes about 1,400.
OPUS_MT = re.compile(r"^opus-mt-([a-z]{2,3})-([a-z]{2,3})$")
OPUS_MT_ORG = "Helsinki-NLP"

# Many-language models by their short names (sharded checkpoints, such as NLLB-200 3.3B, are
# not imported yet).
MULTILINGUAL = {
    "nllb-200-distilled-600M": "facebook/nllb-200-distilled-600M",
    "nllb-200-distilled-1.3B": "facebook/nllb-200-distilled-1.3B",
    "nllb-200-1.3B": "facebook/nllb-200-1.3B",
    "m2m100_418M": "facebook/m2m100_418M",
    "m2m100_1.2B": "facebook/m2m100_1.2B",
}

# The files a pull fetches before the weights: the configuration, the model card (its
# licence) and every tokenizer file an importer reads (models/save_format.py TOKENIZER_FILES).
TOKENIZER_FILES = (
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "sentencepiece.bpe.model",
    "special_tokens_map.json",
)
METADATA_FILES = ("config.json", "README.md", *TOKENIZER_FILES)
# Weights in the order a pull prefers them: safetensors loads without pickle.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SHARDED_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

# What each supported architecture (config.json's model_type) needs to tokenize.
REQUIRED_TOKENIZER = {
    "marian": ("source.spm", "target.spm", "vocab.json"),
    "m2m_100": ("sentencepiece.bpe.model",),  # NLLB-200 declares m2m_100 too
}
SUPPORTED = "marian (OPUS-MT) and m2m_100 (M2M-100, NLLB-200)"


@dataclass(frozen=True)
class ModelSource:
    """Where a name points: a Hub repository and the directory name it installs as."""

    hub_id: str
    name: str

    @property
    def pair(self) -> tuple[str, str] | None:
        """The (source, target) an OPUS-MT name spells; None for other names."""
        found = OPUS_MT.match(self.name)
        return (found.group(1), found.group(2)) if found else None


def resolve(name: str) -> ModelSource:
    """The source of an alias or a Hub id (``ORG/NAME``); ``ModelsError`` for anything else."""
    name = name.strip()
    if "/" in name:
        org, _, repo = name.partition("/")
        if not org or not repo or "/" in repo:
            raise ModelsError(f"{name!r} is not a Hugging Face model id (ORG/NAME)")
        return ModelSource(name, repo)
    if name in MULTILINGUAL:
        return ModelSource(MULTILINGUAL[name], name)
    if OPUS_MT.match(name):
        return ModelSource(f"{OPUS_MT_ORG}/{name}", name)
    raise ModelsError(f"unknown model name {name!r}; {known_names()}")


def known_names() -> str:
    """One sentence on what a name may be."""
    return (
        "a name is opus-mt-SRC-TGT (any OPUS-MT pair, e.g. opus-mt-en-fr), one of "
        + ", ".join(MULTILINGUAL)
        + ", or a Hugging Face model id such as Helsinki-NLP/opus-mt-en-fr"
    )
