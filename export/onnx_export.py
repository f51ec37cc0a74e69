"""PyTorch -> ONNX: an encoder graph that also returns every decoder layer's cross-attention K/V,
and ONE decoder graph with a self-attention KV cache of any length P >= 0. The traced decoder
has no control flow; a large vocabulary's export adds one ``If`` after it, around the output
projection (the exact int8 screen of greedy steps, export/vocab_screen.py).

Why the encoder returns cross K/V: they depend only on the source, so computing them once per
request (instead of in the first decoder step, as Optimum does) keeps the decoder graph
identical for every step and never recomputes them.

Names (the contract with ``service/runtime/onnx_model.py``), L = decoder layers:

encoder.onnx
    inputs  input_ids (B, S) int64, attention_mask (B, S) int64
    outputs encoder_hidden_states (B, S, D), cross_key_{i}, cross_value_{i} (B, H, S, Dh)
decoder.onnx
    inputs  input_ids (B, T), positions (B, T), self_attention_mask (B, C+T) int64,
            past_key_{i}, past_value_{i} (B, H, C, Dh), cross_key_{i}, cross_value_{i} (B, H, S, Dh),
            encoder_attention_mask (B, S) int64
            top_k (1,), banned_ids (B*T, nb), watch_ids (B*T, nw) int64 (the search head)
            vocab_screen () bool (only with a vocabulary screen: screen greedy steps)
    outputs logits (B, T, V), new_key_{i}, new_value_{i} (B, H, T, Dh),
            top_log_probs, top_ids (B*T, k), watch_log_probs (B*T, nw)

The self-attention cache is C slots of which the mask's first C columns say which hold a token:
the caller may pass a buffer with spare capacity (invalid slots at the right end) and the graph
returns only the new tokens' keys and values, which the caller writes into the next free slots.
No step copies the cache: returning ``present`` = past + new would cost a ``Concat`` of every
layer's cache at every step (docs/engine.md).

The search head (export/search_head.py) is appended to the traced decoder: log-softmax and
top-k of the last position run in the graph, so the runtime never fetches the full logits.

``decoder_device.onnx`` is that decoder for caches on a device (export/device_decoder.py): it
gathers and trims its past inside the call and returns the grown cache, so a step there is one
session call. Besides the model graphs, three tiny helper graphs are written (``kv_select.onnx``,
``kv_merge.onnx``, ``kv_append.onnx``): row gathers / column slices, padded concatenation of the
2L cache tensors, and appending the new keys and values to caches that live on a device.
The runtime runs them on the same execution provider as the model, so on CUDA the caches never
leave the device when beams are reordered, rows retire or newcomers join (and the runtime needs
neither torch nor numpy copies of the caches).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import onnx
import torch
from onnx import TensorProto, helper
from torch import Tensor, nn

from export.device_decoder import write_device_decoder
from export.quiet import quiet_exporter
from export.search_head import add_search_head
from export.vocab_screen import DEFAULT_MAX_ROWS, MIN_VOCAB, add_vocab_screen
from models.checkpoint import copy_tokenizer_files, language_pair, load_pretrained
from models.transformer import DecoderLayer, MultiHeadAttention, Transformer
from service.runtime.contract import (
    CONFIG_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    ENCODER_INPUTS,
    FORMAT_NAME,
    FORMAT_VERSION,
    KV_APPEND_FILE,
    KV_MERGE_FILE,
    KV_SELECT_FILE,
    SEARCH_INPUTS,
    SEARCH_OUTPUTS,
    decoder_input_names,
    decoder_output_names,
    encoder_output_names,
)

log = logging.getLogger(__name__)

DEFAULT_OPSET = 20  # 23 (ONNX Attention) measures no faster on CPU: bench/engine_bench.py
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory, cross_keys, cross_values = self.model.encode(input_ids, attention_mask)
        interleaved = [t for pair in zip(cross_keys, cross_values, strict=True) for t in pair]
        return (memory, *interleaved)


class DecoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        self_attention_mask: Tensor,
        past_keys: tuple[Tensor, ...],
        past_values: tuple[Tensor, ...],
        cross_keys: tuple[Tensor, ...],
        cross_values: tuple[Tensor, ...],
        encoder_attention_mask: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
        return self.model.decode_new(
            input_ids,
            positions,
            past_keys,
            past_values,
            cross_keys,
            cross_values,
            encoder_attention_mask,
            self_mask=self_attention_mask,
        )


def example_decoder_inputs(model: Transformer, batch: int, new: int, past: int, src: int) -> tuple:
    """Random decoder inputs. Every dynamic dim must be >= 2 when tracing (size 1 gets fixed)."""
    config = model.config
    layers, heads, head_dim = config.decoder_layers, config.decoder_heads, config.decoder_head_dim
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, config.tgt_vocab_size, (batch, new), generator=generator)
    positions = torch.arange(past, past + new).expand(batch, new).contiguous()
    self_mask = torch.ones(batch, past + new, dtype=torch.long)
    cache = lambda length: tuple(  # noqa: E731
        torch.randn(batch, heads, length, head_dim, generator=generator) for _ in range(layers)
    )
    src_mask = torch.ones(batch, src, dtype=torch.long)
    src_mask[0, src - 1 :] = 0
    return (
        input_ids,
        positions,
        self_mask,
        cache(past),
        cache(past),
        cache(src),
        cache(src),
        src_mask,
    )


@contextmanager
def written_out_attention(model: Transformer) -> Iterator[None]:
    """Attention as explicit matmuls while tracing (see ``MultiHeadAttention.written_out``),
    and the decoder's one-token constants (``MultiHeadAttention.fuse_for_export``)."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    decoder_modules = [
        attention
        for layer in cast(Iterable[DecoderLayer], model.decoder_layers)
        for attention in (layer.self_attn, layer.encoder_attn)
    ]
    for module in modules:
        module.written_out = True
    for module in decoder_modules:
        module.fuse_for_export()
    try:
        yield
    finally:
        for module in modules:
            module.written_out = False
            module.unfuse()


# protobuf cannot serialise a message past 2 GiB: larger graphs keep their weights in a
# ``<file>.data`` beside them (ONNX external data; ONNX Runtime reads it from the same folder).
# The headroom is for the graph itself.
EXTERNAL_DATA_BYTES = 1_800_000_000


def initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(len(tensor.raw_data) for tensor in model.graph.initializer)


def save_onnx(model: onnx.ModelProto, path: Path, external_data: bool | None = None) -> None:
    """Save ``model`` (loaded in full), its weights in ``<name>.data`` when ``external_data``
    (None: when they pass EXTERNAL_DATA_BYTES)."""
    path = Path(path)
    data = path.with_name(f"{path.name}.data")
    data.unlink(missing_ok=True)  # onnx appends to a data file that exists
    if external_data is None:
        external_data = initializer_bytes(model) > EXTERNAL_DATA_BYTES
    if external_data:
        onnx.save(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=1024,
        )
    else:
        onnx.save(model, path)


def export_graph(module: nn.Module, args: tuple, path: Path, **options: Any) -> None:
    """``torch.onnx.export`` (the dynamo exporter) of ``module`` on ``args`` to ``path``,
    without the exporter's and the optimizer's chatter (export/quiet.py)."""
    with quiet_exporter():
        torch.onnx.export(module, args, str(path), dynamo=True, verbose=False, **options)


def export_encoder(model: Transformer, path: Path, opset: int, external_data: bool = False) -> None:
    batch, src = torch.export.Dim("batch"), torch.export.Dim("src_len")
    input_ids = torch.randint(2, model.config.src_vocab_size, (3, 5))
    attention_mask = torch.ones(3, 5, dtype=torch.long)
    attention_mask[1, 3:] = 0
    export_graph(
        EncoderGraph(model).eval(),
        (input_ids, attention_mask),
        path,
        opset_version=opset,
        external_data=external_data,
        input_names=list(ENCODER_INPUTS),
        output_names=encoder_output_names(model.config.decoder_layers),
        dynamic_shapes={"input_ids": {0: batch, 1: src}, "attention_mask": {0: batch, 1: src}},
    )


def export_decoder(model: Transformer, path: Path, opset: int, external_data: bool = False) -> None:
    layers = model.config.decoder_layers
    batch, src = torch.export.Dim("batch"), torch.export.Dim("src_len")
    past = torch.export.Dim("past_len", min=0)
    cache = {0: batch, 2: past}
    cross = {0: batch, 2: src}
    # One new token per row (T = 1, static): the engine decodes token by token, and a static T
    # lets the graph drop the causal mask and every head split/merge Transpose.
    dynamic_shapes = {
        "input_ids": {0: batch},
        "positions": {0: batch},
        "self_attention_mask": {0: batch, 1: past + 1},
        "past_keys": tuple(cache for _ in range(layers)),
        "past_values": tuple(cache for _ in range(layers)),
        "cross_keys": tuple(cross for _ in range(layers)),
        "cross_values": tuple(cross for _ in range(layers)),
        "encoder_attention_mask": {0: batch, 1: src},
    }
    export_graph(
        DecoderGraph(model).eval(),
        example_decoder_inputs(model, batch=3, new=1, past=4, src=5),
        path,
        opset_version=opset,
        external_data=external_data,
        input_names=decoder_input_names(layers),
        output_names=decoder_output_names(layers),
        dynamic_shapes=dynamic_shapes,
    )


def write_kv_helpers(output_dir: Path, num_tensors: int, elem_type: int, opset: int) -> None:
    """Helper graphs over ``num_tensors`` cache tensors (N, H, L, Dh), run on the model's EP.

    kv_select: x_j, rows (M,), start (1,), end (1,) -> Gather(x_j, rows, axis 0)[:, :, start:end]
        (beam reorder, retiring rows, repeating a source for its beams, trimming columns)
    kv_merge: a_j (N, H, La, Dh), b_j (M, H, Lb, Dh), a_pads, b_pads (8,) -> (N+M, H, L, Dh):
        each side zero-padded on axis 2 by its pads (Pad's layout: begins of the 4 axes, then
        ends), then concatenated (newcomers join a running batch: self-attention pasts padded
        on the left, sources on the right; the masks say which slots are real)
    kv_append: x_j (N, H, L, Dh), new_j (N, H, T, Dh) -> (N, H, L+T, Dh): the decoder's new
        keys/values after the cache, for caches on a device (the host writes them into spare
        capacity instead)
    """
    opset_import = [helper.make_opsetid("", min(opset, 21))]
    shape = ["rows", "heads", "length", "head_dim"]

    def tensor(name: str, dims: list) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem_type, dims)

    int_input = lambda name, dims: helper.make_tensor_value_info(name, TensorProto.INT64, dims)  # noqa: E731

    def save(graph: onnx.GraphProto, file_name: str) -> None:
        model = helper.make_model(graph, opset_imports=opset_import, ir_version=10)
        onnx.save(model, output_dir / file_name)

    axes = helper.make_tensor("axis_2", TensorProto.INT64, [1], [2])

    nodes = []
    for j in range(num_tensors):
        nodes += [
            helper.make_node("Gather", [f"x_{j}", "rows"], [f"gathered_{j}"], axis=0),
            helper.make_node("Slice", [f"gathered_{j}", "start", "end", "axis_2"], [f"y_{j}"]),
        ]
    select = helper.make_graph(
        nodes,
        "kv_select",
        [tensor(f"x_{j}", shape) for j in range(num_tensors)]
        + [int_input("rows", ["out_rows"]), int_input("start", [1]), int_input("end", [1])],
        [
            tensor(f"y_{j}", ["out_rows", "heads", "out_length", "head_dim"])
            for j in range(num_tensors)
        ],
        initializer=[axes],
    )
    save(select, KV_SELECT_FILE)

    nodes = []
    for j in range(num_tensors):
        nodes += [
            helper.make_node("Pad", [f"a_{j}", "a_pads"], [f"a_padded_{j}"]),
            helper.make_node("Pad", [f"b_{j}", "b_pads"], [f"b_padded_{j}"]),
            helper.make_node("Concat", [f"a_padded_{j}", f"b_padded_{j}"], [f"y_{j}"], axis=0),
        ]
    merge = helper.make_graph(
        nodes,
        "kv_merge",
        [tensor(f"a_{j}", shape) for j in range(num_tensors)]
        + [
            tensor(f"b_{j}", ["new_rows", "heads", "new_length", "head_dim"])
            for j in range(num_tensors)
        ]
        + [int_input("a_pads", [8]), int_input("b_pads", [8])],
        [
            tensor(f"y_{j}", ["all_rows", "heads", "out_length", "head_dim"])
            for j in range(num_tensors)
        ],
    )
    save(merge, KV_MERGE_FILE)

    nodes = [
        helper.make_node("Concat", [f"x_{j}", f"new_{j}"], [f"y_{j}"], axis=2)
        for j in range(num_tensors)
    ]
    append = helper.make_graph(
        nodes,
        "kv_append",
        [tensor(f"x_{j}", shape) for j in range(num_tensors)]
        + [
            tensor(f"new_{j}", ["rows", "heads", "new_length", "head_dim"])
            for j in range(num_tensors)
        ],
        [tensor(f"y_{j}", ["rows", "heads", "out_length", "head_dim"]) for j in range(num_tensors)],
    )
    save(append, KV_APPEND_FILE)


def control_flow_ops(model: onnx.ModelProto) -> set[str]:
    found = {node.op_type for node in model.graph.node if node.op_type in CONTROL_FLOW_OPS}
    for function in model.functions:
        found |= {node.op_type for node in function.node if node.op_type in CONTROL_FLOW_OPS}
    return found


def export_config(model: Transformer, opset: int, variant: str, kv_dtype: str = "float32") -> dict:
    config = model.config
    layers = config.decoder_layers
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "model": config.to_dict(),
        "special_ids": {
            "pad_id": config.pad_id,
            "eos_id": config.eos_id,
            "unk_id": config.unk_id,
            "decoder_start_id": config.decoder_start_id,
        },
        "num_layers": layers,
        "num_heads": config.decoder_heads,
        "head_dim": config.decoder_head_dim,
        "vocab_size": config.tgt_vocab_size,
        "max_positions": config.max_positions,
        "opset": opset,
        "variant": variant,
        "kv_dtype": kv_dtype,
        "encoder": {
            "inputs": list(ENCODER_INPUTS),
            "outputs": encoder_output_names(layers),
        },
        "decoder": {
            "inputs": decoder_input_names(layers) + list(SEARCH_INPUTS),
            "outputs": decoder_output_names(layers) + list(SEARCH_OUTPUTS),
        },
    }


def export_model(
    model: Transformer,
    output_dir: str | Path,
    opset: int = DEFAULT_OPSET,
    tokenizer_dir: str | Path | None = None,
    model_name: str = "",
    languages: tuple[str, str] | None = None,
    vocab_screen: bool = True,
    external_data: bool | None = None,
) -> Path:
    """Write the fp32 export (encoder, decoder, device decoder, KV helpers, config.json,
    tokenizer files).

    ``external_data``: weights in ``encoder.onnx.data`` / ``decoder.onnx.data`` (None: where a
    graph could pass protobuf's 2 GiB, as NLLB-200-600M's decoder with its 256k table does).

    config.json declares the model's ``source_lang`` / ``target_lang`` (the service routes by
    them): ``languages`` if given, else what the tokenizer config says. ``vocab_screen``: give
    the decoder the exact int8 screen of greedy steps (export/vocab_screen.py) when the target
    vocabulary has at least ``MIN_VOCAB`` ids."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    started = time.perf_counter()
    if external_data is None:
        # every weight once, in fp32, plus the int8 screen's copy of the output table
        weights = sum(p.numel() for p in model.parameters()) * 4
        external_data = weights > EXTERNAL_DATA_BYTES // 2
    with torch.no_grad(), written_out_attention(model):
        export_encoder(model, output_dir / ENCODER_FILE, opset, external_data)
        export_decoder(model, output_dir / DECODER_FILE, opset, external_data)
    decoder = onnx.load(output_dir / DECODER_FILE)
    if found := control_flow_ops(decoder):
        raise RuntimeError(f"decoder graph has control flow {sorted(found)}")
    add_search_head(decoder)
    screen_candidates = 0
    if vocab_screen and model.config.tgt_vocab_size >= MIN_VOCAB:
        screen_candidates = add_vocab_screen(decoder)
    save_onnx(decoder, output_dir / DECODER_FILE, external_data or None)
    del decoder
    write_device_decoder(output_dir, model.config.decoder_layers)
    write_kv_helpers(output_dir, 2 * model.config.decoder_layers, TensorProto.FLOAT, opset)
    config = export_config(model, opset, "fp32")
    if screen_candidates:
        config["vocab_screen"] = {"candidates": screen_candidates, "max_rows": DEFAULT_MAX_ROWS}
    config["model_name"] = model_name or output_dir.name
    config["export_seconds"] = round(time.perf_counter() - started, 2)
    if tokenizer_dir is not None:
        config["tokenizer_files"] = copy_tokenizer_files(tokenizer_dir, output_dir)
        config.update(language_pair(tokenizer_dir))
        if codes := multilingual_languages(output_dir, model.config.tgt_vocab_size):
            config["languages"] = codes  # the service routes every pair of them here
    if languages is not None:
        config["source_lang"], config["target_lang"] = languages
    (output_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    log.info("exported %s in %.1f s", output_dir, config["export_seconds"])
    return output_dir


def multilingual_languages(export_dir: Path, vocab_size: int) -> list[str]:
    """The language codes of an exported multilingual tokenizer (NLLB-200) that the model's
    table has rows for; [] for a model of one pair. A code past the table would be a token
    the model never saw: a checkpoint trimmed to fewer languages keeps only its own."""
    from service.text.tokenizer import Tokenizer

    if not (export_dir / "sentencepiece.bpe.model").exists():
        return []
    tokenizer = Tokenizer.from_dir(export_dir)
    return [code for code in tokenizer.languages if tokenizer.target_prefix(code)[0] < vocab_size]


def export_from_dir(
    model_dir: str | Path,
    output_dir: str | Path,
    opset: int = DEFAULT_OPSET,
    vocab_screen: bool = True,
) -> Path:
    model = load_pretrained(model_dir)
    return export_model(
        model,
        output_dir,
        opset,
        tokenizer_dir=model_dir,
        model_name=Path(model_dir).name,
        vocab_screen=vocab_screen,
    )
