"""An export prints our progress lines only: not torch's "torchvision is not installed"
warnings, nor the onnxscript optimizer's and onnx_ir passes' INFO lines (issue: a newcomer's
`make serve` printed hundreds of them)."""

from __future__ import annotations

import logging

import torch

from export.onnx_export import export_graph

CHATTER = ("torchvision", "constant folding", "unused", "rewrite rules", "PassManager")


def test_an_export_prints_no_torchvision_warning_and_no_optimizer_chatter(tmp_path, capfd, caplog):
    caplog.set_level(logging.INFO)  # what `python -m export` logs at
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    export_graph(
        module,
        (torch.randn(2, 4),),
        tmp_path / "tiny.onnx",
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    assert (tmp_path / "tiny.onnx").stat().st_size > 0
    printed = capfd.readouterr()
    said = printed.out + printed.err + caplog.text
    assert not [word for word in CHATTER if word in said], said[-3000:]
    chatty = [r.name for r in caplog.records if r.name.startswith(("torch", "onnx"))]
    assert not chatty, chatty
