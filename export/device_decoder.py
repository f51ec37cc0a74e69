"""The decoder for caches that live on a device: one call per step, the cache moves inside it.

Why: a step on the device path (service/runtime/device_kv.py) ran the decoder and then helper
graphs on its caches: ``kv_append`` (the new keys after the cache) every step, and
``kv_select`` (a row gather and a column trim) whenever beams reorder or rows leave. Each call is
an IO binding and a session run on the host, and on a GPU the host is what bounds a step (the
decoder call's time is flat in rows). This graph does both inside the decoder call:

``past_rows`` (N,) int64
    the row of the cache tensors each of the step's N rows continues (a beam's parent, the
    rows that remain after others left); ``arange(N)`` when nothing moved.
``past_start`` (1,) int64
    the first cache slot kept (the slots left of it were valid only for rows that left).

Every ``past_*`` input, (M, H, C, Dh), becomes ``past[past_rows][:, :, past_start:]`` before
anything reads it (one ``Gather`` per cache, module below), and the outputs ``new_*`` become ``present_key_{i}``, ``present_value_{i}``
(N, H, C - past_start + T, Dh): that cache with the new keys/values appended, the next step's
past. The search head's outputs and ``logits`` are unchanged.

It is derived from the finished ``decoder.onnx`` of each variant (fp32 with or without the
vocabulary screen, fp16, int8) by adding nodes, so it computes what that graph computes. It costs
the host path nothing: the CPU default (numpy caches, service/runtime/host_kv.py) writes new keys
into spare slots in place and runs ``decoder.onnx``. Weights are not copied where the decoder
keeps them in external data (``decoder.onnx.data``, shared by both graphs); a small decoder's
inline weights are written twice.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from service.runtime.contract import (
    DECODER_FILE,
    DEVICE_DECODER_FILE,
    PAST_ROWS_INPUT,
    PAST_START_INPUT,
    new_names,
    past_names,
    present_names,
)

PREFIX = "cache_gather/"


def _rename_inputs(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Every node input named in ``renamed`` reads the new name, in subgraphs too (an ``If``
    branch may read an outer value)."""
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in renamed:
                node.input[index] = renamed[name]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(attribute.g, renamed)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    _rename_inputs(subgraph, renamed)


def _constant(name: str, values: list[int], scalar: bool = False) -> onnx.NodeProto:
    dims = [] if scalar else [len(values)]
    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, dims, values)
    )


def _slot_index_nodes(first_past: str) -> list[onnx.NodeProto]:
    """Nodes computing ``cache_gather/index`` (N, H, C - start) int64: the row of a cache
    flattened to (M * H * C, Dh) that each kept slot of each step row and head reads,
    ``(past_rows[n] * H + h) * C + start + s``. Computed once for all 2L caches."""
    name = lambda suffix: f"{PREFIX}{suffix}"  # noqa: E731
    return [
        _constant(name("zero"), [0], scalar=True),
        _constant(name("one"), [1], scalar=True),
        _constant(name("heads_axis"), [1], scalar=True),
        _constant(name("slots_axis"), [2], scalar=True),
        _constant(name("axes_1_2"), [1, 2]),
        _constant(name("axes_0_2"), [0, 2]),
        _constant(name("axes_0_1"), [0, 1]),
        helper.make_node("Shape", [first_past], [name("shape")]),  # (4,): M, H, C, Dh
        helper.make_node("Gather", [name("shape"), name("heads_axis")], [name("heads")]),
        helper.make_node("Gather", [name("shape"), name("slots_axis")], [name("slots")]),
        helper.make_node("Squeeze", [PAST_START_INPUT], [name("start")]),
        helper.make_node("Mul", [name("heads"), name("slots")], [name("row_size")]),  # H*C
        helper.make_node(
            "Range", [name("start"), name("slots"), name("one")], [name("kept_slots")]
        ),  # (C - start,)
        # (H,): h * C, by a Range of steps of one (a step of C = 0, an empty cache, is refused)
        helper.make_node("Range", [name("zero"), name("heads"), name("one")], [name("head_ids")]),
        helper.make_node("Mul", [name("head_ids"), name("slots")], [name("head_starts")]),
        helper.make_node("Mul", [PAST_ROWS_INPUT, name("row_size")], [name("row_starts")]),
        helper.make_node("Unsqueeze", [name("row_starts"), name("axes_1_2")], [name("rows_3d")]),
        helper.make_node("Unsqueeze", [name("head_starts"), name("axes_0_2")], [name("heads_3d")]),
        helper.make_node("Unsqueeze", [name("kept_slots"), name("axes_0_1")], [name("slots_3d")]),
        helper.make_node("Add", [name("rows_3d"), name("heads_3d")], [name("row_heads")]),
        helper.make_node("Add", [name("row_heads"), name("slots_3d")], [name("index")]),
    ]


def add_cache_gather(model: onnx.ModelProto, num_layers: int) -> None:
    """Turn a decoder graph (contract.py) into the device decoder, in place.

    The row gather and the slot trim are one ``Gather`` per cache, of the cache seen as
    (M * H * C, Dh) rows (a ``Reshape``, no copy) at a shared index: a ``Gather`` then a
    ``Slice`` copied every cache twice per step (measured on the CPU provider: 64 rows x 128
    slots, 29 ms a step against 24 ms)."""
    graph = model.graph
    inputs = {value.name: value for value in graph.input}
    pasts = past_names(num_layers)
    if PAST_ROWS_INPUT in inputs:
        raise ValueError("the decoder already gathers its cache rows")
    name = lambda suffix: f"{PREFIX}{suffix}"  # noqa: E731
    first_nodes = _slot_index_nodes(pasts[0]) + [
        _constant(name("dim_axis"), [3]),
        _constant(name("minus_one"), [-1]),
        helper.make_node("Gather", [name("shape"), name("dim_axis")], [name("head_dim")]),
        helper.make_node(
            "Concat", [name("minus_one"), name("head_dim")], [name("flat_shape")], axis=0
        ),  # (2,): -1, Dh
    ]
    selected = {past: name(past) for past in pasts}
    for past in pasts:
        first_nodes += [
            helper.make_node("Reshape", [past, name("flat_shape")], [name(f"{past}_flat")]),
            helper.make_node(
                "Gather", [name(f"{past}_flat"), name("index")], [selected[past]], axis=0
            ),  # (N, H, C - start, Dh)
        ]
        # the cache may have other rows than the step (rows left, beams repeat a parent)
        dims = inputs[past].type.tensor_type.shape.dim
        dims[0].dim_param, dims[2].dim_param = "cache_rows", "cache_len"
    _rename_inputs(graph, selected)
    for index, node in enumerate(first_nodes):
        node.name = name(f"{index}_{node.op_type}")
    nodes = first_nodes + list(graph.node)

    outputs = {value.name: value for value in graph.output}
    news = new_names(num_layers)
    presents = present_names(num_layers)
    for past, new, present in zip(pasts, news, presents, strict=True):
        concat = helper.make_node("Concat", [selected[past], new], [present], axis=2)
        concat.name = name(f"append_{present}")
        nodes.append(concat)
        value = outputs[new]
        value.name = present
        value.type.tensor_type.shape.dim[2].dim_param = "present_len"
    del graph.node[:]
    graph.node.extend(nodes)
    graph.input.extend(
        [
            helper.make_tensor_value_info(PAST_ROWS_INPUT, TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info(PAST_START_INPUT, TensorProto.INT64, [1]),
        ]
    )


def write_device_decoder(export_dir: Path, num_layers: int) -> Path:
    """``decoder_device.onnx`` from the ``decoder.onnx`` beside it (external weights shared)."""
    export_dir = Path(export_dir)
    model = onnx.load(export_dir / DECODER_FILE, load_external_data=False)
    add_cache_gather(model, num_layers)
    path = export_dir / DEVICE_DECODER_FILE
    onnx.save(model, path)  # external tensors keep pointing at decoder.onnx.data
    return path
