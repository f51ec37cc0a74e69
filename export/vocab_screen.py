"""An exact int8 screen of the output projection for greedy steps of the fp32 decoder.

Why: at batch 1 a decoder step reads every weight once, and with a large vocabulary the output
projection is most of them (Marian-base: 58101 x 512 fp32 = 119 MB of the step's 203 MB). A
greedy step only needs the best id of each row (and the log-probs of a few watched ids), so:

1. rank the whole vocabulary with an int8 copy of the projection (30 MB): approximate logits
   ``a_i`` with a proven bound ``|z_i - a_i| <= B_i`` on their error;
2. take the K ids with the largest upper bounds ``a_i + B_i`` as candidates, and compute their
   logits (and the watched ids') exactly, in fp32, from the fp32 rows;
3. if, in every row, the (k + bans)-th best exact logit among the candidates is above the
   largest upper bound outside them, no other id can be among the row's best k + bans: the
   search head's answer over the candidates is its answer over the whole vocabulary. Otherwise
   (a flat distribution, or more bans than candidates) the step runs the full fp32 projection.

So greedy outputs are those of the fp32 graph (up to fp32 summation order, as between batch
sizes). What is not exact: the log-softmax normaliser is taken over the candidates only, so
``top_log_probs`` and ``watch_log_probs`` are shifted up by one constant per row (the log of
the share of the probability mass outside the candidates).
Greedy search and the placeholder constraint only compare log-probs within a row (argmax, and
the owed symbols renormalised over themselves), which that shift does not change; beam search
compares rows and accumulates scores, so only steps whose ``top_k`` is 1 (greedy only) are
screened: the graph screens a step when its bool input ``vocab_screen`` is true,
``top_k == 1`` and the step has at most ``max_rows`` rows (128: the widest step at which the
screen is known to pay). The runtime feeds true on the CPU provider and false on CUDA (where the
projection is compute, not a memory stream, and the screen's int8 ops have no CUDA kernels).

The error bound, for vocabulary row ``W_i`` quantized per row as ``W^_i = s_i Q_i`` (7-bit
int8, ``s_i = max |W_i| / 63``) and the hidden state ``h`` quantized per step by ONNX
``DynamicQuantizeLinear`` as ``h^ = s_h (q_h - zp)`` (uint8), with ``E_i = W_i - W^_i`` and
``f = h - h^`` (both known: ``f`` from the same ``q_h`` the matmul uses):

    z_i - a_i = W^_i . f + E_i . h,   so   |z_i - a_i| <= ||W^_i|| ||f|| + ||E_i|| ||h||

(Cauchy-Schwarz), plus ``c ||W_i|| ||h||`` with ``c = 3 D 2^-24`` for fp32 rounding in either
path. ``a_i`` itself is exact up to rounding: the int8 x uint8 products are summed in int32.
That holds on every CPU only because the weights use 7 bits: ONNX Runtime's u8s8 kernels on
AVX2 without VNNI add pairs of products in int16 with saturation (``vpmaddubsw``), and
``2 * 255 * 63 = 32130`` fits in int16 where ``2 * 255 * 127`` does not.

Graph (the original projection and search head move into the branches of an ``If``)::

    If(vocab_screen and top_k == 1 and rows <= max_rows)
      then: int8 screen -> candidates -> exact logits
            If(every row covered)
              then: search head over the candidates
              else: full projection + search head (the original nodes)
      else: full projection + search head (the original nodes)

``strip_vocab_screen`` restores the plain graph (the int8 and fp16 variants start from it).
Measurements: BENCHMARKS.md and docs/engine.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.search_head import HEAD_PREFIX, ban_and_rank_nodes
from service.runtime.contract import SCREEN_INPUT, SEARCH_OUTPUTS

SCREEN_PREFIX = "vocab_screen/"
FULL_PREFIX = f"{SCREEN_PREFIX}full/"
DEFAULT_CANDIDATES = 128
# Marian-base, 2 threads, AVX-512, step time screened / full: 0.70-0.74 at 1 row, 0.78-0.84 at 8,
# 0.82-0.85 at 16, 0.87 at 32, 0.90-0.93 at 64, 0.91-0.94 at 128 (beyond: not measured;
# bench/vocab_screen.py).
DEFAULT_MAX_ROWS = 128
# Below this vocabulary size the projection is a small part of a step: not worth a screen.
MIN_VOCAB = 16384


def has_vocab_screen(model: onnx.ModelProto) -> bool:
    return any(value.name == SCREEN_INPUT for value in model.graph.input)


@dataclass
class Projection:
    """How a decoder graph makes ``logits`` from its last hidden state."""

    matmul: onnx.NodeProto  # hidden (N, T, D) @ weight (D, V)
    bias_add: onnx.NodeProto | None  # + bias (V,), if the graph has one
    hidden_name: str
    rows: np.ndarray  # (V, D) fp32: the weight's rows, one per vocabulary id
    rows_name: str | None  # the (V, D) initializer to gather rows from; None: none exists
    bias: np.ndarray | None  # (V,)


def find_projection(graph: onnx.GraphProto, logits_name: str) -> Projection:
    producer = {output: node for node in graph.node for output in node.output}
    initializers = {init.name: init for init in graph.initializer}
    last = producer[logits_name]
    bias_add, matmul, bias = None, last, None
    if last.op_type == "Add":
        bias_add = last
        first, second = last.input
        bias_name, product = (second, first) if second in initializers else (first, second)
        bias = numpy_helper.to_array(initializers[bias_name]).reshape(-1)
        matmul = producer[product]
    if matmul.op_type != "MatMul":
        raise ValueError(f"logits come from {matmul.op_type}, not MatMul (+ bias)")
    hidden_name, weight_name = matmul.input
    if weight_name in initializers:  # (D, V): the rows are its transpose
        rows = numpy_helper.to_array(initializers[weight_name]).T
        rows_name = None
    else:  # Transpose of a (V, D) initializer: tied embeddings, or nn.Linear's weight
        transpose = producer[weight_name]
        perm = [attr.ints for attr in transpose.attribute if attr.name == "perm"]
        if transpose.op_type != "Transpose" or list(perm[0]) != [1, 0]:
            raise ValueError(f"projection weight {weight_name} is not a transposed initializer")
        rows_name = transpose.input[0]
        rows = numpy_helper.to_array(initializers[rows_name])
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    return Projection(matmul, bias_add, hidden_name, rows, rows_name, bias)


# The largest weight magnitude: 7 bits, so that no pair sum of a u8s8 kernel saturates int16.
WEIGHT_MAX = 63


def quantized_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """rows (V, D) fp32 -> Q (V, D) int8, scales (V,), and the two bound coefficients (V,):
    ``||E_i|| + c ||W_i||`` (times ||h||) and ``||W^_i||`` (times ||f||), rounded up."""
    exact = rows.astype(np.float64)
    peak = np.abs(exact).max(axis=1)
    # float32 scales, as the graph holds them: the error below is that of the graph's rows
    scales = np.where(peak > 0, peak / WEIGHT_MAX, 1.0).astype(np.float32).astype(np.float64)
    quantized = np.clip(np.rint(exact / scales[:, None]), -WEIGHT_MAX, WEIGHT_MAX)
    approximated = quantized * scales[:, None]
    dim = rows.shape[1]
    rounding = 3.0 * dim * 2.0**-24
    error_norm = np.linalg.norm(exact - approximated, axis=1)
    hidden_coefficient = error_norm + rounding * np.linalg.norm(exact, axis=1)
    quantized_coefficient = np.linalg.norm(approximated, axis=1)
    up = lambda values: (values * (1 + 1e-6)).astype(np.float32)  # noqa: E731
    return (
        quantized.astype(np.int8),
        scales.astype(np.float32),
        up(hidden_coefficient),
        up(quantized_coefficient),
    )


def _renamed(nodes: list[onnx.NodeProto], prefix: str) -> list[onnx.NodeProto]:
    """Copies of ``nodes`` whose outputs (and the uses of them among ``nodes``) and names
    carry ``prefix``: a branch's own tensors, outer-scope inputs untouched."""
    produced = {output for node in nodes for output in node.output}
    copies = []
    for index, node in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + (node.name or f"{index}_{node.op_type}")
        copy.input[:] = [prefix + name if name in produced else name for name in node.input]
        copy.output[:] = [prefix + name for name in node.output]
        copies.append(copy)
    return copies


def _branch(name: str, nodes: list, outputs: list[str], like: dict) -> onnx.GraphProto:
    """A subgraph returning ``outputs`` (typed like the graph outputs in ``like``)."""
    values = []
    for output, original in zip(outputs, like, strict=True):
        value = onnx.ValueInfoProto()
        value.CopyFrom(like[original])
        value.name = output
        values.append(value)
    return helper.make_graph(nodes, name, [], values)


def _s(suffix: str) -> str:
    """The screen's own names: initializers, tensors and nodes all carry SCREEN_PREFIX."""
    return f"{SCREEN_PREFIX}{suffix}"


def _constants(projection: Projection, candidates: int, max_rows: int) -> list[onnx.TensorProto]:
    S, vocab = _s, projection.rows.shape[0]
    quantized, scales, hidden_coefficient, quantized_coefficient = quantized_rows(projection.rows)
    return [
        numpy_helper.from_array(np.ascontiguousarray(quantized.T), S("weight_int8")),  # (D, V)
        numpy_helper.from_array(scales, S("row_scales")),  # (V,)
        numpy_helper.from_array(  # (2, V): B = [||h||, ||f||] @ this
            np.stack([hidden_coefficient, quantized_coefficient]), S("bound_coefficients")
        ),
        numpy_helper.from_array(
            projection.bias if projection.bias is not None else np.zeros(vocab, np.float32),
            S("bias"),
        ),
        numpy_helper.from_array(np.array([1], np.int64), S("one")),
        numpy_helper.from_array(np.array([0], np.int64), S("zero")),
        numpy_helper.from_array(np.array([2], np.int64), S("two")),
        numpy_helper.from_array(np.array([-1], np.int64), S("last_axis")),
        numpy_helper.from_array(np.array([candidates], np.int64), S("candidates")),
        numpy_helper.from_array(np.array([candidates + 1], np.int64), S("candidates_and_one")),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), S("end")),
        numpy_helper.from_array(np.array([vocab], np.int64), S("vocab")),
        numpy_helper.from_array(np.array([max_rows], np.int64), S("max_rows")),
    ]


def _screen_nodes(hidden_name: str, rows_name: str) -> list[onnx.NodeProto]:
    """Steps 1 and 2: approximate logits and their bounds, the candidates, their exact logits
    (and the watched ids'), the normaliser."""
    S, node = _s, helper.make_node
    return [
        # h (N, T, D) -> (N*T, D): every position is ranked, as in the search head.
        node("Flatten", [hidden_name], [S("hidden")], axis=2),
        node("Shape", [hidden_name], [S("hidden_shape")]),
        node("Slice", [S("hidden_shape"), S("zero"), S("two")], [S("rows_shape")]),
        node("Concat", [S("rows_shape"), S("vocab")], [S("logits_shape")], axis=0),
        # Approximate logits: int8 rows x uint8 hidden state, summed exactly in int32.
        node("DynamicQuantizeLinear", [S("hidden")], [S("hidden_q"), S("h_scale"), S("h_zero")]),
        node(
            "MatMulInteger",
            [S("hidden_q"), S("weight_int8"), S("h_zero")],
            [S("int_logits")],
        ),
        node("Cast", [S("int_logits")], [S("int_logits_f")], to=TensorProto.FLOAT),
        node("Mul", [S("row_scales"), S("h_scale")], [S("logit_scales")]),
        node("Mul", [S("int_logits_f"), S("logit_scales")], [S("approx_no_bias")]),
        node("Add", [S("approx_no_bias"), S("bias")], [S("approx_logits")]),  # (N, V)
        # The bound per row and id: ||h|| and ||f|| (f = h - dequantized h, from the same q_h).
        node("Cast", [S("hidden_q")], [S("hidden_q_f")], to=TensorProto.FLOAT),
        node("Cast", [S("h_zero")], [S("h_zero_f")], to=TensorProto.FLOAT),
        node("Sub", [S("hidden_q_f"), S("h_zero_f")], [S("hidden_q_centred")]),
        node("Mul", [S("hidden_q_centred"), S("h_scale")], [S("hidden_dequantized")]),
        node("Sub", [S("hidden"), S("hidden_dequantized")], [S("hidden_error")]),
        node("ReduceSumSquare", [S("hidden"), S("last_axis")], [S("hidden_sq")], keepdims=1),
        node("ReduceSumSquare", [S("hidden_error"), S("last_axis")], [S("error_sq")], keepdims=1),
        node("Concat", [S("hidden_sq"), S("error_sq")], [S("norms_sq")], axis=1),  # (N, 2)
        node("Sqrt", [S("norms_sq")], [S("norms")]),
        node("MatMul", [S("norms"), S("bound_coefficients")], [S("bound")]),  # (N, V)
        node("Add", [S("approx_logits"), S("bound")], [S("upper")]),
        # Candidates: the K best upper bounds; the (K+1)-th bounds every id outside them.
        node(
            "TopK",
            [S("upper"), S("candidates_and_one")],
            [S("upper_top"), S("upper_ids")],
            axis=-1,
            largest=1,
            sorted=1,
        ),
        node("Slice", [S("upper_top"), S("candidates"), S("end"), S("one")], [S("outside_best")]),
        node("Slice", [S("upper_ids"), S("zero"), S("candidates"), S("one")], [S("by_bound")]),
        # Candidates in id order, so that TopK's ties (lower position first) are lower ids
        # first, as over the whole vocabulary.
        node("Neg", [S("by_bound")], [S("negated_ids")]),
        node(
            "TopK",
            [S("negated_ids"), S("candidates")],
            [S("negated_sorted"), S("unused_pos")],
            axis=-1,
            largest=1,
            sorted=1,
        ),
        node("Neg", [S("negated_sorted")], [S("candidate_ids")]),  # (N, K)
        # Exact fp32 logits of the candidates and the watched ids: (N, K+W).
        node("Concat", [S("candidate_ids"), "watch_ids"], [S("exact_ids")], axis=1),
        node("Gather", [rows_name, S("exact_ids")], [S("exact_rows")], axis=0),  # (N, K+W, D)
        node("Unsqueeze", [S("hidden"), S("two")], [S("hidden_column")]),  # (N, D, 1)
        node("MatMul", [S("exact_rows"), S("hidden_column")], [S("exact_column")]),
        node("Squeeze", [S("exact_column"), S("two")], [S("exact_no_bias")]),
        node("Gather", [S("bias"), S("exact_ids")], [S("exact_bias")], axis=0),
        node("Add", [S("exact_no_bias"), S("exact_bias")], [S("exact_logits")]),
        node(
            "Slice",
            [S("exact_logits"), S("zero"), S("candidates"), S("one")],
            [S("candidate_logits")],
        ),
        node(
            "Slice", [S("exact_logits"), S("candidates"), S("end"), S("one")], [S("watch_logits")]
        ),
        # The normaliser over the candidates only: a row constant like any other for greedy
        # search, and one over (rows, V) cost 8 % of a 16-row step (ONNX Runtime's
        # ReduceLogSumExp is a slow pass).
        node(
            "ReduceLogSumExp",
            [S("candidate_logits"), S("last_axis")],
            [S("log_normaliser")],
            keepdims=1,
        ),
    ]


def _coverage_nodes() -> list[onnx.NodeProto]:
    """Step 3: ``covered`` (a bool) when the candidates provably hold every row's best."""
    S, node = _s, helper.make_node
    return [
        # Covered: the (k + bans)-th best candidate beats every outside upper bound, in every
        # row, and k + bans <= K.
        node("Shape", ["banned_ids"], [S("banned_shape")]),
        node("Gather", [S("banned_shape"), S("one")], [S("ban_count")]),
        node("Add", ["top_k", S("ban_count")], [S("wide_k")]),
        node("LessOrEqual", [S("wide_k"), S("candidates")], [S("fits")]),
        node("Min", [S("wide_k"), S("candidates")], [S("checked_k")]),
        node(
            "TopK",
            [S("candidate_logits"), S("checked_k")],
            [S("best_exact"), S("unused_ids")],
            axis=-1,
            largest=1,
            sorted=1,
        ),
        node("Sub", [S("checked_k"), S("one")], [S("kth")]),
        node("Gather", [S("best_exact"), S("kth")], [S("kth_exact")], axis=1),  # (N, 1)
        node("Greater", [S("kth_exact"), S("outside_best")], [S("row_covered")]),
        node("Cast", [S("row_covered")], [S("row_covered_int")], to=TensorProto.INT32),
        node("ReduceMin", [S("row_covered_int")], [S("all_covered_int")], keepdims=0),
        node("Cast", [S("all_covered_int")], [S("all_covered")], to=TensorProto.BOOL),
        node("And", [S("all_covered"), S("fits")], [S("covered")]),
    ]


def _candidate_head_nodes() -> list[onnx.NodeProto]:
    """The search head over the candidates: log-probs, bans, top k."""
    S, node = _s, helper.make_node
    return [
        node("Sub", [S("candidate_logits"), S("log_normaliser")], [S("candidate_log_probs")]),
        node("Sub", [S("watch_logits"), S("log_normaliser")], [S("c/watch_log_probs")]),
        *ban_and_rank_nodes(
            S("c/"),
            S("candidate_log_probs"),
            S("candidate_ids"),
            S("c/top_log_probs"),
            S("c/top_ids"),
        ),
        node("Reshape", [S("approx_logits"), S("logits_shape")], [S("c/logits")]),
    ]


def _decision_nodes() -> list[onnx.NodeProto]:
    """``screen_step``: the input says yes, a greedy step (top_k 1), at most max_rows rows."""
    S, node = _s, helper.make_node
    return [
        node("Equal", ["top_k", S("one")], [S("greedy_step")]),
        node("Shape", ["banned_ids"], [S("step_shape")]),
        node("Gather", [S("step_shape"), S("zero")], [S("step_rows")]),
        node("LessOrEqual", [S("step_rows"), S("max_rows")], [S("few_rows")]),
        node("And", [S("greedy_step"), S("few_rows")], [S("greedy_few")]),
        node("And", [SCREEN_INPUT, S("greedy_few")], [S("screen_step")]),
    ]


def _named(nodes: list[onnx.NodeProto], stem: str) -> list[onnx.NodeProto]:
    for index, made in enumerate(nodes):
        if not made.name:
            made.name = _s(f"{stem}{index}_{made.op_type}")
    return nodes


def add_vocab_screen(
    model: onnx.ModelProto,
    candidates: int = DEFAULT_CANDIDATES,
    max_rows: int = DEFAULT_MAX_ROWS,
    logits_name: str = "logits",
) -> int:
    """Put the screen in a decoder that has a search head, in place; returns K (the
    candidates per row, at most V - 1). Steps of more than ``max_rows`` rows run the full
    projection: the more rows, the more the matmul is compute rather than a stream of weights,
    and the smaller the screen's gain (0.94 of the full step at 128 rows)."""
    if has_vocab_screen(model):
        raise ValueError("the decoder already has a vocabulary screen")
    graph = model.graph
    projection = find_projection(graph, logits_name)
    candidates = min(candidates, projection.rows.shape[0] - 1)
    initializers = _constants(projection, candidates, max_rows)
    rows_name = projection.rows_name
    if rows_name is None:  # untransposed (D, V) weight: keep a row-major copy to gather from
        initializers.append(numpy_helper.from_array(projection.rows, _s("rows")))
        rows_name = _s("rows")

    # The nodes the screen replaces: the projection and the search head. Copies of them are
    # both fallbacks: when the screen is off, and when it cannot prove a step.
    head_nodes = [node for node in graph.node if node.name.startswith(HEAD_PREFIX)]
    moved = [
        projection.matmul,
        *([projection.bias_add] if projection.bias_add is not None else []),
        *head_nodes,
    ]
    outputs = [logits_name, *SEARCH_OUTPUTS]
    like = {value.name: value for value in graph.output}
    like = {name: like[name] for name in outputs}
    screened_outputs = [_s(f"screened/{name}") for name in outputs]
    covered_if = helper.make_node(
        "If",
        [_s("covered")],
        screened_outputs,
        name=_s("if_covered"),
        then_branch=_branch(
            "vocab_screen_candidates",
            _named(_candidate_head_nodes(), "candidates_"),
            [_s(f"c/{name}") for name in outputs],
            like,
        ),
        else_branch=_branch(
            "vocab_screen_fallback",
            _renamed(moved, f"{FULL_PREFIX}inner/"),
            [f"{FULL_PREFIX}inner/{name}" for name in outputs],
            like,
        ),
    )
    screen = _named(
        [*_screen_nodes(projection.hidden_name, rows_name), *_coverage_nodes()], "screen_"
    )
    screen_if = helper.make_node(
        "If",
        [_s("screen_step")],
        outputs,
        name=_s("if"),
        then_branch=_branch("vocab_screen", [*screen, covered_if], screened_outputs, like),
        else_branch=_branch(
            "vocab_screen_off",
            _renamed(moved, FULL_PREFIX),
            [f"{FULL_PREFIX}{name}" for name in outputs],
            like,
        ),
    )
    moved_ids = {id(node) for node in moved}
    kept = [node for node in graph.node if id(node) not in moved_ids]
    del graph.node[:]
    graph.node.extend([*kept, *_named(_decision_nodes(), "decide_"), screen_if])
    graph.initializer.extend(initializers)
    graph.input.append(helper.make_tensor_value_info(SCREEN_INPUT, TensorProto.BOOL, []))
    return candidates


def strip_vocab_screen(model: onnx.ModelProto) -> bool:
    """Undo ``add_vocab_screen`` in place (the full projection and head back in the main
    graph); returns whether there was a screen."""
    if not has_vocab_screen(model):
        return False
    graph = model.graph
    [screen_if] = [node for node in graph.node if node.name == f"{SCREEN_PREFIX}if"]
    [full] = [attr.g for attr in screen_if.attribute if attr.name == "else_branch"]
    produced = {output for node in full.node for output in node.output}
    unprefixed = lambda name: name[len(FULL_PREFIX) :] if name in produced else name  # noqa: E731
    restored = []
    for node in full.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = node.name[len(FULL_PREFIX) :]
        copy.input[:] = [unprefixed(name) for name in node.input]
        copy.output[:] = [unprefixed(name) for name in node.output]
        restored.append(copy)
    kept = [node for node in graph.node if not node.name.startswith(SCREEN_PREFIX)]
    del graph.node[:]
    graph.node.extend([*kept, *restored])
    initializers = [init for init in graph.initializer if not init.name.startswith(SCREEN_PREFIX)]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    inputs = [value for value in graph.input if value.name != SCREEN_INPUT]
    del graph.input[:]
    graph.input.extend(inputs)
    return True
