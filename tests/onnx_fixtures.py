"""Session-scoped ONNX exports of the tiny random Marian model, shared by the export and
engine tests (import the fixtures into a test module to use them)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from models.checkpoint import load_pretrained
from models.transformer import Transformer


@dataclass
class Exported:
    model: Transformer  # the PyTorch reference the export came from
    model_dir: Path  # the Marian checkpoint dir
    onnx_dir: Path  # the fp32 export (default opset)


@pytest.fixture(scope="session")
def exported(marian_dir, tmp_path_factory) -> Exported:
    from export.onnx_export import export_model

    model = load_pretrained(marian_dir)
    onnx_dir = tmp_path_factory.mktemp("onnx") / "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_model(model, onnx_dir, tokenizer_dir=marian_dir, model_name="tiny-marian")
    return Exported(model, Path(marian_dir), onnx_dir)


def random_step_feeds(config, rows: int, past: int, src: int, rng) -> dict[str, np.ndarray]:
    """A decoder step's model inputs (no search head inputs): ``rows`` rows at position
    ``past`` with random caches of ``past`` self-attention and ``src`` cross-attention slots."""
    shape = (rows, config.decoder_heads, past, config.decoder_head_dim)
    cross = (rows, config.decoder_heads, src, config.decoder_head_dim)
    feeds = {
        "input_ids": rng.integers(2, 90, (rows, 1)),
        "positions": np.full((rows, 1), past),
        "self_attention_mask": np.ones((rows, past + 1), dtype=np.int64),
        "encoder_attention_mask": np.ones((rows, src), dtype=np.int64),
    }
    for i in range(config.decoder_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal(shape).astype(np.float32)
            feeds[f"cross_{kind}_{i}"] = rng.standard_normal(cross).astype(np.float32)
    return feeds
