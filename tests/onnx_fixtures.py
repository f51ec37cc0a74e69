"""Session-scoped ONNX exports of the tiny random Marian model, shared by the export and
engine tests (import the fixtures into a test module to use them)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

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


def padded_sources(model: Transformer, lengths: list[int], seed: int = 3):
    """Source ids (B, S) ending in eos, right-padded, their mask, and the unpadded lists."""
    from export.verify import padded_source

    src_ids, src_mask = padded_source(lengths, model, seed=seed)
    sources = [row[: int(mask.sum())].tolist() for row, mask in zip(src_ids, src_mask, strict=True)]
    return src_ids, src_mask, sources


def reference(
    model: Transformer,
    sources: list[list[int]],
    beam_size: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
):
    """models.search on each sentence alone (no padding at all): the batch-independent truth."""
    from models.search import beam_search, greedy_search

    outputs = []
    for source in sources:
        src_ids = torch.tensor([source])
        src_mask = torch.ones_like(src_ids)
        if beam_size == 1:
            outputs += greedy_search(model, src_ids, src_mask, max_new_tokens=max_new_tokens)
        else:
            outputs += beam_search(
                model,
                src_ids,
                src_mask,
                beam_size=beam_size,
                max_new_tokens=max_new_tokens,
                length_penalty=length_penalty,
            )
    return outputs
