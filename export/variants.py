"""Variants of an fp32 export, each a complete export dir with the same file names.

- int8 (CPU), including the tied output projection (``fold_transposed_weights``): by default
  ``per_row`` (export/per_row_int8.py: activations quantized row by row, so that a translation
  does not depend on its batch; attention products kept off MLAS's one-row kernel). The ORT
  dynamic quantization modes below scale a whole batch's activations with one factor and are
  kept to measure against it. Plain signed QInt8 weights risk int16 saturation in the u8*s8
  kernel on CPUs without VNNI (docs/toolchain.md). Measured on random weights at Marian-base size
  (teacher-forced top-1 agreement with fp32 over 1,792 positions; engine tokens/s, 1 thread):
  ``reduce_range`` 0.979, 2.4-2.9x fp32 speed (default); ``quint8`` 0.989 but no faster than
  fp32 on this AVX2 CPU (its u8*u8 kernel is slow), which defeats the purpose; plain ``qint8``
  0.992 here, kept only for measurement given the saturation risk on real weights.
- fp16: for CUDA. Weights, activations and the KV caches are fp16 (half the cache traffic);
  the search head (log-softmax, top-k) and ``logits`` stay fp32, so beam scores are unchanged.

``python -m export.variants --fp32 DIR [--fp16] [--optimize]`` builds and measures every variant against fp32 on
random sentences: token agreement of greedy and beam-4 outputs, and seconds per batch. Session
graph optimizations (ORT_ENABLE_ALL) are always on in the runtime; the offline
``onnxruntime.transformers.optimize_model`` pass is measured too (``--optimize``) and is not part
of the default export because it brought nothing here (Marian-base size, opset 20: greedy
0.67 s vs 0.62 s, beam 4 2.99 s vs 2.55 s for 16 sentences x 16 tokens).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np
import onnx

from export.device_decoder import write_device_decoder
from export.onnx_export import (
    EXTERNAL_DATA_BYTES,
    initializer_bytes,
    save_onnx,
    write_kv_helpers,
)
from export.per_row_int8 import attention_rows_apart, quantize_per_row
from export.search_head import HEAD_PREFIX
from export.vocab_screen import strip_vocab_screen
from service.runtime.contract import DECODER_FILE, ENCODER_FILE, KV_HELPER_FILES
from service.runtime.variants import INT8_CHECK_KEY

log = logging.getLogger(__name__)

INT8_MODES = {
    # name: (weight type, reduce_range) of ORT's dynamic quantization, one activation scale per
    # matrix; kept to measure against "per_row" (export/per_row_int8.py), the default.
    "reduce_range": ("QInt8", True),
    "quint8": ("QUInt8", False),
    "qint8": ("QInt8", False),  # inaccurate without VNNI; kept only to measure it
}
PER_ROW_MODE = "per_row"
DEFAULT_INT8_MODE = PER_ROW_MODE


def _copy_side_files(source: Path, target: Path) -> dict:
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and ".onnx" not in path.name:  # graphs and their external data
            shutil.copyfile(path, target / path.name)
    return json.loads((source / "config.json").read_text())


def _write_config(target: Path, config: dict) -> None:
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def fold_transposed_weights(model: onnx.ModelProto) -> int:
    """Replace ``MatMul(x, Transpose(W))`` for an initializer W by ``MatMul(x, W_t)``.

    The tied output projection is exported as ``x @ embedding.T``; the quantizer skips a MatMul
    whose B is not a constant, which would leave the largest matrix of the model (V x D) in
    fp32. The embedding table itself stays as it is for the Gather. Returns how many folded."""
    from onnx import numpy_helper

    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    folded = 0
    for node in list(model.graph.node):
        if node.op_type != "Transpose" or node.input[0] not in initializers:
            continue
        users = consumers.get(node.output[0], [])
        if not users or any(
            user.op_type != "MatMul" or user.input[1] != node.output[0] for user in users
        ):
            continue
        weight = numpy_helper.to_array(initializers[node.input[0]])
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        transposed = numpy_helper.from_array(
            np.ascontiguousarray(weight.transpose(perm)), f"{node.input[0]}.transposed"
        )
        model.graph.initializer.append(transposed)
        for user in users:
            user.input[1] = transposed.name
        model.graph.node.remove(node)
        folded += 1
    return folded


def make_int8(fp32_dir: str | Path, output_dir: str | Path, mode: str = DEFAULT_INT8_MODE) -> Path:
    source, target = Path(fp32_dir), Path(output_dir)
    if mode != PER_ROW_MODE and mode not in INT8_MODES:
        raise ValueError(f"unknown int8 mode {mode!r}")
    config = _copy_side_files(source, target)
    config.pop("vocab_screen", None)
    config.pop(INT8_CHECK_KEY, None)  # the fp32 export's check of its own int8 variant
    for name in (ENCODER_FILE, DECODER_FILE):
        model = onnx.load(source / name)
        strip_vocab_screen(model)  # an int8 projection needs no int8 screen
        fold_transposed_weights(model)
        if mode == PER_ROW_MODE:
            quantize_per_row(model)
            attention_rows_apart(model)
            save_onnx(model, target / name)
        else:
            _quantize_dynamic(model, target, name, mode)
        del model
    for name in KV_HELPER_FILES:  # caches stay fp32
        shutil.copyfile(source / name, target / name)
    write_device_decoder(target, config["num_layers"])
    config.update(variant=f"int8-{mode}", model_name=f"{config.get('model_name', source.name)}")
    _write_config(target, config)
    return target


def _quantize_dynamic(model: onnx.ModelProto, target: Path, name: str, mode: str) -> None:
    """ONNX Runtime's dynamic quantization of ``model`` into ``target / name``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type, reduce_range = INT8_MODES[mode]
    prepared = target / f"prepared-{name}"
    large = initializer_bytes(model) > EXTERNAL_DATA_BYTES
    save_onnx(model, prepared, large)
    quantize_dynamic(
        prepared,
        target / name,
        weight_type=getattr(QuantType, weight_type),
        reduce_range=reduce_range,
        op_types_to_quantize=["MatMul", "Gemm"],
        use_external_data_format=large,
    )
    prepared.unlink()
    prepared.with_name(f"{prepared.name}.data").unlink(missing_ok=True)


def make_fp16(fp32_dir: str | Path, output_dir: str | Path) -> Path:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source, target = Path(fp32_dir), Path(output_dir)
    config = _copy_side_files(source, target)
    for name in (ENCODER_FILE, DECODER_FILE):
        model = onnx.load(source / name)
        strip_vocab_screen(model)  # fp16 is for CUDA, where the screen is off
        # The search head stays float32 (beam scores), and so do the float outputs it feeds.
        head_nodes = [node.name for node in model.graph.node if node.name.startswith(HEAD_PREFIX)]
        keep_fp32 = ["logits", "top_log_probs", "watch_log_probs"] if name == DECODER_FILE else []
        converted = convert_float_to_float16(
            model, keep_io_types=keep_fp32 or False, node_block_list=head_nodes
        )
        drop_duplicate_nodes(converted)
        save_onnx(converted, target / name)
    write_kv_helpers(target, 2 * config["num_layers"], onnx.TensorProto.FLOAT16, config["opset"])
    write_device_decoder(target, config["num_layers"])
    config.pop("vocab_screen", None)
    config.update(variant="fp16", kv_dtype="float16")
    _write_config(target, config)
    return target


def drop_duplicate_nodes(model: onnx.ModelProto) -> int:
    """Remove second copies of identical nodes and rename other nodes whose name is taken;
    returns how many nodes were removed or renamed.

    ``convert_float_to_float16`` names the Cast it puts before a float32-only node after the
    value it casts. On a decoder exported by torch 2.11 it produced two nodes named
    ``search_head/all_log_probs_cast_to_fp32_node``, and ONNX Runtime refuses a graph with two
    nodes of one name. An identical copy computes nothing the first does not; a different node
    only needs a name of its own."""
    seen: set[bytes] = set()
    names: set[str] = set()
    kept = []
    changed = 0
    for node in model.graph.node:
        key = node.SerializeToString(deterministic=True)
        if key in seen:
            log.info("fp16: dropped a second copy of node %s", node.name)
            changed += 1
            continue
        seen.add(key)
        if node.name and node.name in names:
            renamed = next(
                f"{node.name}_{n}" for n in range(1, 10**6) if f"{node.name}_{n}" not in names
            )
            log.info("fp16: renamed a second node %s (%s) to %s", node.name, node.op_type, renamed)
            node.name = renamed
            changed += 1
        names.add(node.name)
        kept.append(node)
    if len(kept) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return changed


def make_optimized(fp32_dir: str | Path, output_dir: str | Path) -> Path:
    """Offline transformer fusions (bart model type); measured, not used by default."""
    from onnxruntime.transformers.optimizer import optimize_model

    source, target = Path(fp32_dir), Path(output_dir)
    config = _copy_side_files(source, target)
    for name in (ENCODER_FILE, DECODER_FILE):
        optimized = optimize_model(
            str(source / name), model_type="bart", num_heads=config["num_heads"], opt_level=1
        )
        optimized.save_model_to_file(str(target / name))
    for name in KV_HELPER_FILES:
        shutil.copyfile(source / name, target / name)
    write_device_decoder(target, config["num_layers"])
    config.update(variant="fp32-optimized")
    _write_config(target, config)
    return target


def random_sources(
    vocab_size: int, special: set[int], eos_id: int, count: int, seed: int = 0
) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    allowed = np.array([t for t in range(vocab_size) if t not in special])
    lengths = rng.integers(4, 24, size=count)
    return [rng.choice(allowed, size=length - 1).tolist() + [eos_id] for length in lengths]


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """Identical-output rate and position-wise token agreement (over the reference's length)."""
    identical = sum(a == b for a, b in zip(reference, other, strict=True)) / len(reference)
    same = total = 0
    for a, b in zip(reference, other, strict=True):
        total += max(len(a), len(b), 1)
        same += sum(x == y for x, y in zip(a, b, strict=False)) + (not a and not b)
    return {"identical": identical, "token_agreement": same / total}


def top1_agreement(
    fp32_dir: str | Path, other_dir: str | Path, sources: list[list[int]], steps: int = 16
) -> float:
    """Teacher-forced next-token agreement: both decoders see fp32's greedy prefix; the fraction
    of (sentence, step) positions where their argmax (pad banned) is the same. Unlike comparing
    whole outputs, one early disagreement does not count every later token as different."""
    from service.runtime.model_io import StepInputs
    from service.runtime.onnx_model import OnnxSeq2Seq

    models = [OnnxSeq2Seq(fp32_dir, "cpu"), OnnxSeq2Seq(other_dir, "cpu")]
    info = models[0].info
    rows = len(sources)
    src_ids = np.full((rows, max(map(len, sources))), info.pad_id, dtype=np.int64)
    src_mask = np.zeros_like(src_ids)
    for row, source in enumerate(sources):
        src_ids[row, : len(source)], src_mask[row, : len(source)] = source, 1
    cross = [model.kv.encode(src_ids, src_mask) for model in models]
    past = [model.kv.empty(rows) for model in models]
    tokens = np.full((rows, 1), info.decoder_start_id, dtype=np.int64)
    same = 0
    for step in range(steps):
        inputs = StepInputs.lockstep(tokens, step, src_mask, top_k=1, pad_id=info.pad_id)
        choices = []
        for index, model in enumerate(models):
            head, past[index] = model.kv.decode(inputs, past[index], cross[index])
            choices.append(head.top_ids[:, 0])
        same += int((choices[0] == choices[1]).sum())
        tokens = choices[0][:, None]
    return same / (rows * steps)


def compare(
    fp32_dir: str | Path,
    variant_dirs: dict[str, Path],
    count: int = 32,
    max_new_tokens: int = 24,
    intra_op_threads: int = 0,
) -> dict:
    """Every variant against fp32 on ``count`` random sentences, greedy and beam 4, one batch."""
    from service.runtime.engine import Engine

    engines = {"fp32": Engine.from_dir(fp32_dir, provider="cpu", intra_op_threads=intra_op_threads)}
    for name, path in variant_dirs.items():
        engines[name] = Engine.from_dir(path, provider="cpu", intra_op_threads=intra_op_threads)
    info = engines["fp32"].model.info
    sources = random_sources(
        info.vocab_size, {info.pad_id, info.eos_id, info.decoder_start_id}, info.eos_id, count
    )
    results: dict = {}
    for beam in (1, 4):
        outputs = {}
        for name, engine in engines.items():
            engine.warmup()
            started = time.perf_counter()
            outputs[name] = engine.translate_ids(
                sources, beam_size=beam, max_new_tokens=max_new_tokens
            )
            results.setdefault(name, {})[f"beam{beam}_seconds"] = round(
                time.perf_counter() - started, 3
            )
        for name in engines:
            results[name].update(
                {
                    f"beam{beam}_{k}": round(v, 4)
                    for k, v in agreement(outputs["fp32"], outputs[name]).items()
                }
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build and measure export variants against fp32.")
    parser.add_argument("--fp32", required=True, type=Path, help="fp32 export dir")
    parser.add_argument("--int8-modes", default="per_row,reduce_range,quint8,qint8")
    parser.add_argument(
        "--fp16", action="store_true", help="also build fp16 (CPU timings mean little)"
    )
    parser.add_argument(
        "--optimize", action="store_true", help="also measure optimize_model fusions"
    )
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    variants: dict[str, Path] = {}
    for mode in filter(None, args.int8_modes.split(",")):
        variants[f"int8-{mode}"] = make_int8(args.fp32, Path(f"{args.fp32}-int8-{mode}"), mode)
    if args.fp16:
        variants["fp16"] = make_fp16(args.fp32, Path(f"{args.fp32}-fp16"))
    if args.optimize:
        variants["optimized"] = make_optimized(args.fp32, Path(f"{args.fp32}-optimized"))
    results = compare(args.fp32, variants, args.count, args.max_new_tokens, args.threads)
    info = json.loads((args.fp32 / "config.json").read_text())
    special = set(info["special_ids"].values())
    sources = random_sources(
        info["vocab_size"], special, info["special_ids"]["eos_id"], args.count, seed=1
    )
    for name, path in variants.items():
        results[name]["top1_agreement"] = round(
            top1_agreement(args.fp32, path, sources, args.max_new_tokens), 4
        )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
