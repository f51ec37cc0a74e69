"""int8 MatMuls with per-row activation scales (export/per_row_int8.py): the numbers they
compute, and a translation that does not depend on its batch."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.per_row_int8 import attention_rows_apart, quantize_per_row

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_EN_DE = ROOT / "build" / "onnx" / "default"
K, N = 288, 96


def matmuls(weights: list[np.ndarray]) -> onnx.ModelProto:
    """``x @ W_i`` for every weight, all reading the one input x (batch, time, K)."""
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(len(weights))]
    graph = helper.make_graph(
        nodes,
        "matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", K])],
        [
            helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["batch", "time", N])
            for i in range(len(weights))
        ],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def reference(
    x: np.ndarray, weight: np.ndarray, weight_max: int = 63, levels: int = 127
) -> np.ndarray:
    """Per-row int8 written from the definition: each row of x scaled by its own max |x| to
    [-127, 127] and rounded (float32, as the graph divides), each column of W by its own
    max |W| / weight_max; the integer product and the scales in float64."""
    row_max = np.abs(x).max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        unit = x / row_max
    x_q = np.nan_to_num(np.rint(unit / np.float32(1 / levels))).astype(np.float64)
    weight = weight.astype(np.float64)
    column_scale = np.abs(weight).max(axis=0) / weight_max
    w_q = np.round(weight / column_scale)
    assert np.abs(x_q).max() <= levels and np.abs(w_q).max() <= weight_max
    return (x_q @ w_q) * column_scale * (row_max / levels)


def test_per_row_matmul_matches_a_numpy_reference_of_per_row_quantization():
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=(K, N)).astype(np.float32) for _ in range(2)]
    weights[1][:, 3] *= 50  # one outlier column: its scale is its own
    model = matmuls(weights)
    assert quantize_per_row(model) == 2
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("QuantizeLinear") == 1  # one quantized input for both readers
    assert ops.count("MatMulIntegerToFloat") == 2 and "MatMul" not in ops
    assert "Mul" not in ops  # the row scale is the op's own a_scale
    x = rng.normal(size=(3, 5, K)).astype(np.float32)
    x[1] *= 300  # rows of very different ranges
    x[2, 1, 7] = 40  # an outlier inside one row
    x[2, 0] = 0  # a row of zeros (padding)
    outputs = session(model).run(None, {"x": x})
    for output, weight in zip(outputs, weights, strict=True):
        expected = reference(x, weight)
        scale = np.abs(expected).max(axis=-1, keepdims=True) + 1e-30
        np.testing.assert_array_less(np.abs(output - expected) / scale, 1e-5)
        assert not np.any(output[2, 0])
    # int8's numbers, not fp32's: off the float product by more than float rounding.
    plain = x @ weights[0]
    assert np.abs(outputs[0] - plain).max() > 1e-3 * np.abs(plain).max()


def test_a_relus_output_is_quantized_to_all_256_levels_without_abs():
    rng = np.random.default_rng(3)
    weight = rng.normal(size=(K, N)).astype(np.float32)
    model = matmuls([weight])
    relu = helper.make_node("Relu", ["x"], ["hidden"])
    model.graph.node[0].input[0] = "hidden"
    model.graph.node.insert(0, relu)
    quantize_per_row(model)
    assert "Abs" not in [node.op_type for node in model.graph.node]
    x = rng.normal(size=(2, 3, K)).astype(np.float32)
    x[1, 2] = -np.abs(x[1, 2])  # a row the Relu turns into zeros
    output = session(model).run(None, {"x": x})[0]
    expected = reference(np.maximum(x, 0), weight, levels=255)
    scale = np.abs(expected).max(axis=-1, keepdims=True) + 1e-30
    np.testing.assert_array_less(np.abs(output - expected) / scale, 1e-5)
    assert not np.any(output[1, 2])


def test_a_rows_output_does_not_depend_on_the_rows_beside_it():
    rng = np.random.default_rng(1)
    model = matmuls([rng.normal(size=(K, N)).astype(np.float32)])
    quantize_per_row(model)
    run = session(model)
    sentence = rng.normal(size=(1, 4, K)).astype(np.float32)
    loud = 1000 * rng.normal(size=(1, 4, K)).astype(np.float32)
    alone = run.run(None, {"x": sentence})[0]
    batched = run.run(None, {"x": np.concatenate([sentence, loud])})[0]
    np.testing.assert_array_equal(batched[:1], alone)


def test_seven_bit_weights_reach_the_extremes_without_int16_saturation():
    # x_q + 128 = 255 against weights of 63 in every position: each u8*s8 pair sums to
    # 2 * 255 * 63 = 32,130, the largest AVX2's vpmaddubsw can hold in int16.
    weight = np.ones((K, N), np.float32)
    weight[:, 1] = -1
    model = matmuls([weight])
    quantize_per_row(model)
    x = np.ones((2, 1, K), np.float32)
    x[1] = -1
    output = session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(output, x @ weight, rtol=1e-6)


def attention(heads: int = 4, head_dim: int = 72) -> onnx.ModelProto:
    """Softmax of scores over key positions, then those probabilities times the values."""
    nodes = [
        helper.make_node("Softmax", ["scores"], ["probabilities"], axis=-1),
        helper.make_node("MatMul", ["probabilities", "values"], ["context"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, heads, 1, "keys"]),
            helper.make_tensor_value_info(
                "values", TensorProto.FLOAT, [1, heads, "keys", head_dim]
            ),
        ],
        [helper.make_tensor_value_info("context", TensorProto.FLOAT, [1, heads, 1, head_dim])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores.astype(np.float64) - scores.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def test_attention_over_padded_keys_gives_the_bits_of_attention_over_the_keys_alone():
    # A sentence's keys alone and padded (masked scores, other rows' values) as a longer source
    # beside it pads them, in a decoder step's shape (one query per head): MLAS's one-row
    # float32 kernel pairs the key positions, and the plain graph differed in the last bit in
    # 57 of these 200 draws (AVX2), which per-row quantization can turn into a different
    # integer downstream.
    model = attention()
    assert attention_rows_apart(model) == 1
    run = session(model)
    rng = np.random.default_rng(2)
    for _ in range(200):
        keys, pad = int(rng.integers(2, 40)), int(rng.integers(1, 20))
        scores = rng.normal(size=(1, 4, 1, keys)).astype(np.float32)
        values = rng.normal(size=(1, 4, keys, 72)).astype(np.float32)
        masked = np.full((1, 4, 1, pad), np.finfo(np.float32).min, np.float32)
        other = rng.normal(size=(1, 4, pad, 72)).astype(np.float32)
        alone = run.run(None, {"scores": scores, "values": values})[0]
        padded = run.run(
            None,
            {
                "scores": np.concatenate([scores, masked], axis=-1),
                "values": np.concatenate([values, other], axis=-2),
            },
        )[0]
        np.testing.assert_array_equal(padded, alone)
        assert alone.dtype == np.float32 and alone.shape == (1, 4, 1, 72)
        np.testing.assert_allclose(alone, softmax(scores) @ values, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not (SHIPPED_EN_DE / "decoder.onnx").is_file(), reason="no shipped export")
def test_shipped_en_de_int8_translates_heldout_strings_alone_as_in_batches(tmp_path):
    from export import int8_check
    from export.variants import make_int8

    quantizer_log = logging.getLogger()
    level = quantizer_log.level
    quantizer_log.setLevel(logging.ERROR)  # ORT's quantizer logs every tensor
    try:
        int8_dir = make_int8(SHIPPED_EN_DE, tmp_path / "int8")
    finally:
        quantizer_log.setLevel(level)
    # The 160 strings of which 11 came out differently batched than alone with one activation
    # scale per matrix.
    texts = [source for source, _ in int8_check.heldout_pairs("en", "de", limit=160)]
    batched = int8_check.translate(int8_dir, texts, batch=32)
    alone = int8_check.translate(int8_dir, texts, batch=1)
    differing = [(a, b) for a, b in zip(alone, batched, strict=True) if a != b]
    assert not differing
