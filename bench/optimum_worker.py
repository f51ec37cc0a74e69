"""Optimum ``ORTModelForSeq2SeqLM`` worker for bench/peers.py; runs in bench/.venv-optimum.

Optimum's ONNX Runtime seq2seq classes need transformers < 4.58 (docs/toolchain.md), so this runs in
its own venv (``bash bench/setup_optimum.sh``) and imports nothing from the project:

    bench/.venv-optimum/bin/python bench/optimum_worker.py REQUEST.json

The request (see bench/peer_timing.py) gives ``marian_dir`` (a Hugging Face Marian directory)
and ``artifact_dir``, where the build phase writes Optimum's own export, offline.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_timing import RunFn, generate_runner, package_version, serve  # noqa: E402


def build(request: dict[str, Any]) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    exported = ORTModelForSeq2SeqLM.from_pretrained(request["marian_dir"], export=True)
    exported.save_pretrained(request["artifact_dir"])
    return {}


def load(request: dict[str, Any]) -> tuple[RunFn, dict[str, Any]]:
    import onnxruntime as ort
    import torch
    import transformers
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    threads = request["threads"]
    torch.set_num_threads(threads)  # generate's logits processing and beam bookkeeping
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    model = ORTModelForSeq2SeqLM.from_pretrained(
        request["artifact_dir"], provider="CPUExecutionProvider", session_options=options
    )
    pad_id, eos_id = request["pad_id"], request["eos_id"]

    run = generate_runner(model, pad_id, eos_id)

    versions = {
        "optimum-onnx": package_version("optimum-onnx"),
        "optimum": package_version("optimum"),
        "transformers": transformers.__version__,
        "onnxruntime": ort.__version__,
        "torch": torch.__version__,
    }
    return run, {"versions": versions, "providers": model.encoder.session.get_providers()}


if __name__ == "__main__":
    serve(build, load)
