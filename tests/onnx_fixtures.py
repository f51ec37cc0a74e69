"""Session-scoped ONNX exports of the tiny random Marian model, shared by the export and
engine tests (import the fixtures into a test module to use them)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

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
