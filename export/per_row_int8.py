"""int8 MatMuls whose activations are quantized row by row: a translation that does not depend
on its batch.

ONNX Runtime's dynamic quantization (``DynamicQuantizeLinear`` + ``MatMulInteger``, fused into
``DynamicQuantizeMatMul``) takes one scale and zero point for the whole input matrix, that is for
every row of the batch: a sentence's activations round differently beside a sentence with larger
ones, and its greedy output can change with what shares its batch. No ONNX Runtime op quantizes
row by row, but ``MatMulIntegerToFloat`` scales its output row by row when its ``a_scale`` has
one value per row (ONNX Runtime 1.32: after the product and its per-column scale, in the same
node). This module rewrites every ``MatMul`` of the fp32 graph whose second input is a 2-D float
initializer, as CTranslate2's int8 GEMM computes it:

- weights (K, N), once at export: symmetric int8 per output column,
  ``s_w[n] = max_k |W[k, n]| / WEIGHT_MAX``, ``W_q = round(W / s_w)``;
- activations x (..., K), per call: ``m = max_k |x[..., k]|`` for each row (the last axis) and
  ``x_q = round(127 * x / m)`` in [-127, 127], stored as uint8 with the constant zero point 128
  (``Div`` by m, then ``QuantizeLinear`` with the constant scale 1/127, rounding half to even);
- ``MatMulIntegerToFloat`` sums the int8 products exactly in int32 and multiplies by
  ``s_w / 127`` (1, N) and by ``m`` (M, 1); the exported graph's bias ``Add`` follows
  unchanged (the op would add a bias before the row scale, not after).

Every float operation after the integer sum is elementwise, so a row's output depends on that
row alone. Inputs read by several MatMuls (an encoder layer's Q, K and V; the encoder output
that feeds every cross-attention key and value) are quantized once. A ``Relu``'s output (the
feed-forward layer's hidden units) is never negative: it needs no ``Abs`` and is quantized to
``round(255 * x / m)`` with zero point 0, twice the resolution in the same uint8 (its products
stay within the int16 bound below). A row of zeros has m = 0:
its x_q are whatever 0 / 0 converts to, and its output is 0 all the same (``* m``), so no guard
node is needed.

Why uint8 with zero point 128 and 7-bit weights: MLAS's fast AVX2 kernels multiply uint8 by
int8 with ``vpmaddubsw``, which adds each pair of products into a saturating int16. With x_q +
128 up to 255 and 8-bit weights up to 127 a pair reaches 2 * 255 * 127 = 64,770 and saturates
(wrong sums, not rounding); with weights at most 63 it stays within 2 * 255 * 63 = 32,130.
VNNI and AMX kernels do not saturate, but an export travels between CPUs, so the weights are
7-bit everywhere (ONNX Runtime's ``reduce_range`` makes the same choice). The cost is one bit of
weight precision, kept per column rather than per matrix.

Attention stays float32 but never reaches MLAS's one-row kernel (``attention_rows_apart``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ACTIVATION_MAX = 127
RELU_MAX = 255  # a Relu's output uses all of uint8 from zero point 0 (module doc)
WEIGHT_MAX = 63  # 7-bit weights: no int16 saturation in AVX2's u8*s8 pair sums (module doc)
ZERO_POINT = 128
CONTRIB_DOMAIN = "com.microsoft"


def quantize_weight(
    weight: np.ndarray, weight_max: int = WEIGHT_MAX
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-column int8 of a (K, N) weight: (W_q int8, s_w float32 (N,))."""
    weight = weight.astype(np.float32)
    scale = np.abs(weight).max(axis=0) / np.float32(weight_max)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    quantized = np.clip(np.rint(weight / scale), -weight_max, weight_max).astype(np.int8)
    return quantized, scale


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


class _Names:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.taken = {name for node in model.graph.node for name in (*node.output, node.name)}
        self.taken |= {t.name for t in model.graph.initializer}
        self.taken |= {v.name for v in model.graph.input}

    def __call__(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name


def quantize_per_row(model: onnx.ModelProto, weight_max: int = WEIGHT_MAX) -> int:
    """Rewrite, in place, every ``MatMul(x, W)`` with W a 2-D float initializer into the per-row
    int8 form of the module doc; returns how many were rewritten. The graph must be loaded with
    its weights."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    opset = _opset(model)
    names = _Names(model)
    targets = [
        node
        for node in graph.node
        if node.op_type == "MatMul"
        and node.input[1] in initializers
        and len(initializers[node.input[1]].dims) == 2
        and initializers[node.input[1]].data_type == TensorProto.FLOAT
    ]
    if not targets:
        return 0

    shared = {
        "signed_step": numpy_helper.from_array(
            np.array(1.0 / ACTIVATION_MAX, np.float32), names("per_row/signed_step")
        ),
        "signed_zp": numpy_helper.from_array(
            np.array(ZERO_POINT, np.uint8), names("per_row/signed_zero_point")
        ),
        "relu_step": numpy_helper.from_array(
            np.array(1.0 / RELU_MAX, np.float32), names("per_row/relu_step")
        ),
        "relu_zp": numpy_helper.from_array(np.array(0, np.uint8), names("per_row/relu_zero_point")),
        "axes": numpy_helper.from_array(np.array([-1], np.int64), names("per_row/last_axis")),
    }
    graph.initializer.extend(shared.values())
    const = {key: tensor.name for key, tensor in shared.items()}
    producers = {output: node.op_type for node in graph.node for output in node.output}

    # The quantized form of each activation, made once, just before its first reader.
    quantized: dict[str, tuple[str, str, str]] = {}  # input name -> (x_q, m, kind)
    new_nodes: list[onnx.NodeProto] = []
    weights: dict[tuple[str, str], tuple[str, str]] = {}  # (weight, kind) -> (W_q, s_w / levels)
    rewrite = {id(node) for node in targets}
    for node in graph.node:
        if id(node) not in rewrite:
            new_nodes.append(node)
            continue
        x, w = node.input[0], node.input[1]
        base = node.name or node.output[0]
        if x not in quantized:
            # A Relu's output is never negative: no Abs, and all 256 levels from zero point 0.
            kind = "relu" if producers.get(x) == "Relu" else "signed"
            stem = f"per_row/{x}"
            row_max, unit, q = names(f"{stem}/max"), names(f"{stem}/unit"), names(f"{stem}/q")
            magnitude = x
            if kind == "signed":
                magnitude = names(f"{stem}/abs")
                new_nodes.append(
                    helper.make_node("Abs", [x], [magnitude], name=names(f"{stem}/Abs"))
                )
            if opset >= 18:
                reduce = helper.make_node(
                    "ReduceMax", [magnitude, const["axes"]], [row_max], keepdims=1
                )
            else:
                reduce = helper.make_node(
                    "ReduceMax", [magnitude], [row_max], axes=[-1], keepdims=1
                )
            reduce.name = names(f"{stem}/ReduceMax")
            new_nodes += [
                reduce,
                helper.make_node("Div", [x, row_max], [unit], name=names(f"{stem}/Div")),
                helper.make_node(
                    "QuantizeLinear",
                    [unit, const[f"{kind}_step"], const[f"{kind}_zp"]],
                    [q],
                    name=names(f"{stem}/QuantizeLinear"),
                ),
            ]
            quantized[x] = (q, row_max, kind)
        q, row_max, kind = quantized[x]
        if (w, kind) not in weights:
            w_q, w_scale = quantize_weight(numpy_helper.to_array(initializers[w]), weight_max)
            levels = np.float32(RELU_MAX if kind == "relu" else ACTIVATION_MAX)
            q_name, s_name = names(f"{w}.int8"), names(f"{w}.scale")
            graph.initializer.extend(
                [
                    numpy_helper.from_array(w_q, q_name),
                    numpy_helper.from_array(w_scale / levels, s_name),
                ]
            )
            weights[w, kind] = (q_name, s_name)
        q_name, s_name = weights[w, kind]
        new_nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                [q, q_name, row_max, s_name, const[f"{kind}_zp"]],
                [node.output[0]],
                name=names(f"{base}/MatMulIntegerToFloat"),
                domain=CONTRIB_DOMAIN,
            )
        )
    del graph.node[:]
    graph.node.extend(new_nodes)
    if not any(opset.domain == CONTRIB_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))

    # The float weights go where nothing else reads them (the tied embedding stays for its Gather).
    read = _read_names(graph)
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return len(targets)


PASS_THROUGH = {"Slice", "Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze"}


def attention_rows_apart(model: onnx.ModelProto) -> int:
    """Give every ``MatMul`` of attention probabilities by values one more query row (zeros)
    and drop that row from its output; returns how many were changed.

    Why: a padded batch gives attention more key positions than the sentence alone has (a
    longer source beside it, a cache with more slots); the padded probabilities are exact zeros.
    MLAS sums a product's key positions one after another, so zeros after a sentence's keys
    leave its float32 sums as they are, except in the kernel it keeps for a single row (a
    decoder step's one query, per head): that one pairs the key positions, and the pairs shift
    with an odd key count, so 11 keys and 11 keys followed by a zero summed differently in
    the last bit (a quarter of random draws; AVX2). fp32 outputs never show such a bit; per-row
    quantization turns it into a different integer where ``x / s_x`` lies at a rounding
    boundary, and on the shipped de→en model 1 of 600 held-out strings came out differently
    alone. With two rows MLAS takes its general kernel, whose sums run in key order. Softmax
    needs nothing: masked keys add exact zeros to its sums in their own places."""
    graph = model.graph
    names = _Names(model)
    initializers = {t.name for t in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}

    def from_softmax(name: str) -> bool:
        node = producers.get(name)
        while node is not None and node.op_type in PASS_THROUGH:
            node = producers.get(node.input[0])
        return node is not None and node.op_type == "Softmax"

    targets = [
        node
        for node in graph.node
        if node.op_type == "MatMul"
        and node.input[1] not in initializers
        and from_softmax(node.input[0])
    ]
    if not targets:
        return 0
    shared = {
        "pads": numpy_helper.from_array(np.array([0, 1], np.int64), names("rows_apart/pads")),
        "axis": numpy_helper.from_array(np.array([-2], np.int64), names("rows_apart/axis")),
        "start": numpy_helper.from_array(np.array([0], np.int64), names("rows_apart/start")),
        "end": numpy_helper.from_array(np.array([-1], np.int64), names("rows_apart/end")),
    }
    graph.initializer.extend(shared.values())
    const = {key: tensor.name for key, tensor in shared.items()}
    rewrite = {id(node) for node in targets}
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if id(node) not in rewrite:
            new_nodes.append(node)
            continue
        base = f"rows_apart/{node.name or node.output[0]}"
        padded, wide, output = names(f"{base}/rows"), names(f"{base}/out"), node.output[0]
        new_nodes.append(
            helper.make_node(
                "Pad",
                [node.input[0], const["pads"], "", const["axis"]],
                [padded],
                name=names(f"{base}/Pad"),
            )
        )
        node.input[0] = padded
        node.output[0] = wide
        new_nodes.append(node)
        new_nodes.append(
            helper.make_node(
                "Slice",
                [wide, const["start"], const["end"], const["axis"]],
                [output],
                name=names(f"{base}/Slice"),
            )
        )
    del graph.node[:]
    graph.node.extend(new_nodes)
    return len(targets)


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of ``graph`` or of its subgraphs reads, and the graph's outputs."""
    read = {output.name for output in graph.output}
    for node in graph.node:
        read.update(node.input)
        for attribute in node.attribute:
            for subgraph in (
                *([attribute.g] if attribute.HasField("g") else []),
                *attribute.graphs,
            ):
                read |= _read_names(subgraph)
    return read
