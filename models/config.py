"""The transformer's configuration: every switch needed to represent Marian (OPUS-MT) and
M2M-100 / NLLB-200 exactly."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Activation = Literal["relu", "gelu", "swish"]
# Which sinusoidal table, and how tokens index it (models/transformer.py): "marian" numbers
# every slot from 0; "fairseq" (M2M-100, NLLB) numbers only non-pad tokens from pad_id + 1.
Positions = Literal["marian", "fairseq"]


@dataclass
class TransformerConfig:
    # vocabularies: shared (one table for source, target and output) or separate
    src_vocab_size: int
    tgt_vocab_size: int
    share_embeddings: bool = True  # encoder and decoder use one embedding table
    tie_output: bool = True  # output projection is the decoder embedding table
    final_logits_bias: bool = True  # a learned/imported (1, V) bias added to the logits

    # sizes
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_heads: int = 8
    decoder_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    max_positions: int = 512

    # block layout
    normalize_before: bool = False  # pre-norm when True; Marian is post-norm
    activation: Activation = "swish"
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    layer_norm_eps: float = 1e-5
    positions: Positions = "marian"

    # regularisation (training only)
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0

    # special ids (Marian: eos 0, unk 1, pad last, decoding starts from pad)
    pad_id: int = 0
    eos_id: int = 0
    unk_id: int = 1
    decoder_start_id: int = 0

    def __post_init__(self) -> None:
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size")
        for heads in (self.encoder_heads, self.decoder_heads):
            if self.d_model % heads:
                raise ValueError(f"d_model={self.d_model} is not divisible by {heads} heads")
        if self.positions not in ("marian", "fairseq"):
            raise ValueError(f"unknown positions {self.positions!r}")

    @property
    def decoder_head_dim(self) -> int:
        return self.d_model // self.decoder_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TransformerConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TransformerConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
