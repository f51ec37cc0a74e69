"""The search head's two-stage ranking (export/search_head.py ``blocked_rank_nodes``) against
a numpy reference: the best k unbanned ids per row, log-prob descending then id ascending."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from export.search_head import ban_and_rank_nodes


def ranking_session(vocab_size: int, block: int | None) -> ort.InferenceSession:
    nodes = ban_and_rank_nodes(
        "rank/", "log_probs", None, "top_log_probs", "top_ids", block, vocab_size
    )
    graph = helper.make_graph(
        nodes,
        "ranking",
        [
            helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["n", vocab_size]),
            helper.make_tensor_value_info("top_k", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("banned_ids", TensorProto.INT64, ["n", "b"]),
        ],
        [
            helper.make_tensor_value_info("top_log_probs", TensorProto.FLOAT, ["n", "k"]),
            helper.make_tensor_value_info("top_ids", TensorProto.INT64, ["n", "k"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def reference(log_probs: np.ndarray, k: int, banned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids, values = [], []
    for row, bans in zip(log_probs, banned, strict=True):
        allowed = row.copy()
        allowed[bans] = -np.inf
        order = np.lexsort((np.arange(len(row)), -allowed))[:k]  # value desc, then id asc
        ids.append(order)
        values.append(allowed[order])
    return np.array(values), np.array(ids)


@pytest.mark.parametrize(
    ("vocab_size", "block", "k"),
    [
        (1000, 64, 8),
        (1003, 64, 1),
        (1003, 16, 10),
        (50, 16, 8),
        (70, 64, 5),
        (4099, 64, 16),
        (1024, 64, 8),
        (960, 16, 10),
        (64, 64, 3),
    ],
)
def test_blocked_ranking_equals_reference(vocab_size: int, block: int, k: int) -> None:
    rng = np.random.default_rng(vocab_size + block + k)
    rows = 7
    # Coarse values make many ties (ids of equal log-prob across and within blocks); some rows
    # are flat, and -inf marks ids a model can never emit.
    log_probs = np.round(rng.standard_normal((rows, vocab_size)), 1).astype(np.float32)
    log_probs[1] = -3.0
    log_probs[2, rng.integers(0, vocab_size, vocab_size // 2)] = -np.inf
    log_probs[3, -1] = 10.0  # the best id in the short last block
    banned = rng.integers(0, vocab_size, (rows, 3))
    banned[4] = np.argsort(-log_probs[4], kind="stable")[:3]  # the three best are banned
    feeds = {
        "log_probs": log_probs,
        "top_k": np.array([k], dtype=np.int64),
        "banned_ids": banned.astype(np.int64),
    }
    blocked = ranking_session(vocab_size, block).run(None, feeds)
    single = ranking_session(vocab_size, None).run(None, feeds)
    want_values, want_ids = reference(log_probs, k, banned)
    np.testing.assert_array_equal(blocked[1], want_ids)
    np.testing.assert_array_equal(blocked[0], want_values)
    np.testing.assert_array_equal(blocked[1], single[1])


@pytest.mark.parametrize(("vocab_size", "pooled"), [(8000, False), (1003, True)])
def test_whole_blocks_take_their_maxima_with_one_reduce_max(vocab_size: int, pooled: bool) -> None:
    # A vocabulary the blocks divide (the shipped models' 8,000 ids) is reshaped into them and
    # reduced: ONNX Runtime's ReduceMax is faster than MaxPool over the same values. A short
    # last block needs MaxPool's ceil mode.
    nodes = ban_and_rank_nodes("rank/", "log_probs", None, "p", "i", 64, vocab_size)
    ops = {node.op_type for node in nodes}
    assert ("MaxPool" in ops) is pooled and ("ReduceMax" in ops)
    assert sum(node.op_type == "ReduceMax" for node in nodes) == (1 if pooled else 2)
