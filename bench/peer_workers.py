"""Workers for bench/peers.py that run in the main venv: our engine, CTranslate2, transformers.

    .venv/bin/python bench/peer_workers.py REQUEST.json

System names (``request["system"]``):

- ``ours``, ``ours-plain``, ``ours-int8``: ``service.runtime.engine.Engine`` on our ONNX export of the
  Marian dir (``ours-plain``: the fp32 export without the int8 screen of greedy steps)
  (``export.onnx_export.export_from_dir``; int8 = the exporter's int8 variant);
- ``ours-fp16``: the exporter's fp16 variant of that export (``export.variants.make_fp16``),
  for CUDA;
- ``ct2``, ``ct2-int8``: ``ctranslate2.Translator`` on ``TransformersConverter`` output (on
  CUDA: float16 and int8_float16);
- ``transformers``: ``MarianMTModel.generate`` (``M2M100ForConditionalGeneration`` for
  ``request["arch"] == "nllb"``) in eager PyTorch (on CUDA: in fp16).

``request["device"]`` is "cpu" or "cuda"; on "cuda" a system that cannot run on the GPU fails
rather than fall back to the CPU.

For NLLB every system generates ``request["forced_id"]`` (the target-language code) first and
returns the ids after it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from peer_timing import RunFn, generate_runner, package_version, serve  # noqa: E402

OURS_INT8_MODE = "reduce_range"  # the accurate int8 mode on CPUs without VNNI (docs/toolchain.md)


# --- our engine --------------------------------------------------------------------------


def build_ours(request: dict[str, Any]) -> dict[str, Any]:
    from export.onnx_export import export_from_dir

    artifact_dir = Path(request["artifact_dir"])
    if request["system"] in ("ours", "ours-plain"):
        # ours-plain: the fp32 decoder without the int8 screen of greedy steps
        # (export/vocab_screen.py), to show what the screen is worth
        screen = request["system"] == "ours"
        export_from_dir(request["marian_dir"], artifact_dir, vocab_screen=screen)
        return {}
    fp32_dir = Path(request["fp32_dir"])
    if not (fp32_dir / "decoder.onnx").exists():
        export_from_dir(request["marian_dir"], fp32_dir)
    if request["system"] == "ours-fp16":
        from export.variants import make_fp16

        make_fp16(fp32_dir, artifact_dir)
        return {"variant": "export.variants.make_fp16"}
    return {"int8_mode": make_int8(fp32_dir, artifact_dir)}


def make_int8(fp32_dir: Path, output_dir: Path) -> str:
    """The exporter's int8 variant when available (export/variants.py); otherwise the same
    recipe here: ORT dynamic quantization of MatMul/Gemm weights, 7-bit signed (reduce_range)."""
    try:
        from export.variants import make_int8 as exporter_make_int8
    except ImportError:
        exporter_make_int8 = None
    if exporter_make_int8 is not None:
        exporter_make_int8(fp32_dir, output_dir, mode=OURS_INT8_MODE)
        return f"export.variants.make_int8(mode={OURS_INT8_MODE!r})"

    import shutil

    from onnxruntime.quantization import QuantType, quantize_dynamic

    output_dir.mkdir(parents=True, exist_ok=True)
    for path in fp32_dir.iterdir():
        if path.is_file() and path.name not in ("encoder.onnx", "decoder.onnx"):
            shutil.copyfile(path, output_dir / path.name)
    for name in ("encoder.onnx", "decoder.onnx"):
        quantize_dynamic(
            fp32_dir / name,
            output_dir / name,
            weight_type=QuantType.QInt8,
            reduce_range=True,
            op_types_to_quantize=["MatMul", "Gemm"],
        )
    config = json.loads((output_dir / "config.json").read_text())
    config["variant"] = "int8-reduce_range"
    (output_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return "quantize_dynamic(QInt8, reduce_range=True) [bench fallback]"


def load_ours(request: dict[str, Any]) -> tuple[RunFn, dict[str, Any]]:
    import onnxruntime as ort

    from service.runtime.engine import Engine

    device = request.get("device", "cpu")
    engine = Engine.from_dir(
        request["artifact_dir"], provider=device, intra_op_threads=request["threads"]
    )
    if engine.provider != device:
        raise RuntimeError(f"asked for {device}, the engine runs on {engine.provider}")

    forced_id = request.get("forced_id")

    def run(sources: list[list[int]], beam_size: int, new_tokens: int) -> list[list[int]]:
        # The engine has no minimum length: outputs are as long as the model makes them
        # (bench/peers.py suppresses eos in its random models, so that is new_tokens).
        if forced_id is None:
            return engine.translate_ids(sources, beam_size=beam_size, max_new_tokens=new_tokens)
        return translate_forced(engine, sources, beam_size, new_tokens, forced_id)

    versions = {"onnxruntime": ort.__version__, "numpy": package_version("numpy")}
    return run, {"versions": versions, "provider": engine.provider}


def translate_forced(
    engine: Any, sources: list[list[int]], beam_size: int, new_tokens: int, forced_id: int
) -> list[list[int]]:
    """Every source decoded with ``forced_id`` generated first (not returned), all rows in one
    continuous batch, as the service runs NLLB."""
    from service.runtime.types import DecodeRequest

    ids = [("bench", index) for index in range(len(sources))]
    requests = [
        DecodeRequest(request_id, src, beam_size, new_tokens + 1, forced_prefix=(forced_id,))
        for request_id, src in zip(ids, sources, strict=True)
    ]
    if rejected := engine.add(requests):
        raise ValueError(rejected[0].reason)
    results: dict[Any, list[int]] = {}
    while len(results) < len(ids):
        for done in engine.step():
            results[done.request_id] = done.tokens
    return [results[request_id] for request_id in ids]


# --- CTranslate2 -------------------------------------------------------------------------


def _ct2_quantization(system: str, device: str = "cpu") -> str:
    if device == "cuda":
        return "int8_float16" if system.endswith("int8") else "float16"
    return "int8" if system.endswith("int8") else "float32"


def build_ct2(request: dict[str, Any]) -> dict[str, Any]:
    import ctranslate2

    converter = ctranslate2.converters.TransformersConverter(request["marian_dir"])
    quantization = _ct2_quantization(request["system"], request.get("device", "cpu"))
    converter.convert(request["artifact_dir"], quantization=quantization, force=True)
    return {"quantization": quantization}


def load_ct2(request: dict[str, Any]) -> tuple[RunFn, dict[str, Any]]:
    import ctranslate2

    device = request.get("device", "cpu")
    translator = ctranslate2.Translator(
        request["artifact_dir"],
        device=device,
        compute_type=_ct2_quantization(request["system"], device),
        intra_threads=request["threads"],
        inter_threads=1,
    )
    forced_id = request.get("forced_id")
    if forced_id is None:
        # CTranslate2 speaks tokens, not ids: map through the Marian dir's vocab.json.
        token_ids: dict[str, int] = json.loads(
            Path(request["marian_dir"], "vocab.json").read_text()
        )
    else:
        # The converted model's own vocabulary: its k-th token names row k of the table.
        tokens = json.loads(Path(request["artifact_dir"], "shared_vocabulary.json").read_text())
        token_ids = {token: index for index, token in enumerate(tokens)}
    id_tokens = {index: token for token, index in token_ids.items()}
    # NLLB: the code is the target prefix, and the lengths count it.
    prefix = 0 if forced_id is None else 1

    def run(sources: list[list[int]], beam_size: int, new_tokens: int) -> list[list[int]]:
        target_prefix = None if forced_id is None else [[id_tokens[forced_id]]] * len(sources)
        results = translator.translate_batch(
            [[id_tokens[index] for index in ids] for ids in sources],
            target_prefix=target_prefix,
            beam_size=beam_size,
            min_decoding_length=new_tokens + prefix,
            max_decoding_length=new_tokens + prefix,
            length_penalty=1.0,
        )
        return [[token_ids[token] for token in result.hypotheses[0][prefix:]] for result in results]

    return run, {"versions": {"ctranslate2": ctranslate2.__version__}}


# --- transformers ------------------------------------------------------------------------


def load_transformers(request: dict[str, Any]) -> tuple[RunFn, dict[str, Any]]:
    import torch
    import transformers
    from transformers import M2M100ForConditionalGeneration, MarianMTModel

    torch.set_num_threads(request["threads"])
    nllb = request.get("arch") == "nllb"
    model_class = M2M100ForConditionalGeneration if nllb else MarianMTModel
    model = model_class.from_pretrained(request["marian_dir"]).eval()
    if request.get("device", "cpu") == "cuda":
        model = model.half().to("cuda")
    pad_id, eos_id = request["pad_id"], request["eos_id"]

    run = generate_runner(model, pad_id, eos_id, request.get("forced_id"))

    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    info = {"versions": versions, "torch_threads": torch.get_num_threads()}
    return run, {**info, "torch_device": str(model.device), "torch_dtype": str(model.dtype)}


# --- dispatch ------------------------------------------------------------------------------


def build(request: dict[str, Any]) -> dict[str, Any]:
    system = request["system"]
    if system.startswith("ours"):
        return build_ours(request)
    if system.startswith("ct2"):
        return build_ct2(request)
    raise ValueError(f"{system} has nothing to build")


def load(request: dict[str, Any]) -> tuple[RunFn, dict[str, Any]]:
    system = request["system"]
    if system.startswith("ours"):
        return load_ours(request)
    if system.startswith("ct2"):
        return load_ct2(request)
    if system == "transformers":
        return load_transformers(request)
    raise ValueError(f"unknown system {system!r}")


if __name__ == "__main__":
    serve(build, load)
