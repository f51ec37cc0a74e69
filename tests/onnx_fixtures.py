"""Session-scoped ONNX exports of the tiny random Marian model, shared by the export and
engine tests (import the fixtures into a test module to use them)."""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from models.checkpoint import load_pretrained
from models.transformer import Transformer


@dataclass
class Exported:
    model: Transformer  # the PyTorch reference the export came from
    model_dir: Path  # the Marian checkpoint dir
    onnx_dir: Path  # the fp32 export (default opset)
    # file name -> (torch's graph as ``export_graph`` wrote it, before the exporter's passes;
    # the options it was called with)
    graphs: dict[str, tuple[Path, dict[str, Any]]] = field(default_factory=dict)

    def replay_graph(self, module: Any, args: tuple, path: Path, **options: Any) -> None:
        """``export_graph`` for another export of ``model`` with the same options: torch's
        graph traced for this fixture instead of tracing it again (most of an export's time).
        What the exporter does with the graph after that runs as ever."""
        graph, traced_with = self.graphs[path.name]
        assert getattr(module, "model", None) is self.model, "not the fixture's model"
        same = ("opset_version", "external_data", "input_names", "output_names")
        assert {key: options.get(key) for key in same} == {
            key: traced_with.get(key) for key in same
        }, "other export options than the fixture's"
        shutil.copyfile(graph, path)


@pytest.fixture(scope="session")
def exported(marian_dir, tmp_path_factory) -> Exported:
    from export import onnx_export

    model = load_pretrained(marian_dir)
    root = tmp_path_factory.mktemp("onnx")
    onnx_dir = root / "fp32"
    result = Exported(model, Path(marian_dir), onnx_dir)
    export_graph = onnx_export.export_graph

    def keeping_graph(module: Any, args: tuple, path: Path, **options: Any) -> None:
        export_graph(module, args, path, **options)
        result.graphs[path.name] = (shutil.copyfile(path, root / f"traced-{path.name}"), options)

    with warnings.catch_warnings(), mock.patch.object(onnx_export, "export_graph", keeping_graph):
        warnings.simplefilter("ignore")
        onnx_export.export_model(
            model, onnx_dir, tokenizer_dir=marian_dir, model_name="tiny-marian"
        )
    return result


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
