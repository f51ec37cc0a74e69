"""The search head: log-softmax and top-k of the last position, inside the decoder graph.

Why: beam search needs, per row and step, only the best ``2 x beam`` continuations (greedy:
the best one), yet returning ``logits (N, V)`` makes the host receive and scan all of them:
at Marian-base size (V = 58k) and 128 rows that is 30 MB per step, plus a log-softmax and a
partition over it in numpy. ONNX Runtime does the same work multithreaded next to the matmul
that produced the logits, and only ``N x k`` numbers cross to the host.

Inputs added to the decoder (all int64):

``top_k`` (1,)
    k of TopK (ONNX takes it as an input): the largest k any row of the step needs.
``banned_ids`` (N, B)
    ids whose log-probability becomes -inf: pad and unk always, plus the placeholder
    constraint's bans (symbols a row has used up or the source lacks, eos while symbols are
    owed). As in transformers' logits processors (``bad_words_ids``, ``suppress_tokens``) the
    ban acts after the log-softmax, so beam scores match the reference search. Rows with fewer
    bans repeat one of theirs (pad): banning twice is a no-op.
``watch_ids`` (N, W)
    ids whose log-probabilities *before the bans* the host also needs: for a constrained row
    the placeholder symbols (a row forced to emit what it owes chooses among them,
    renormalised), eos and every id the row bans (with the top 1 they tell whether the row,
    unbanned, would stop). See ``service/runtime/search.py``. Rows without a constraint watch pad.

Outputs added:

``top_log_probs`` (N, k) float32, ``top_ids`` (N, k) int64
    log-softmax with the bans applied, best first (TopK is sorted; ties: lower id first, the
    order ``service/runtime/search.py``'s reference search uses).
``watch_log_probs`` (N, W) float32
    log-probabilities (before the bans) at ``watch_ids``.

Every position is ranked: N rows above stand for N*T (the runtime always feeds T = 1). A large
vocabulary is ranked in two stages, blocks of ids first (``blocked_rank_nodes``): same answer.

``logits`` stays an output (for parity checks); the runtime does not fetch it.
The head is computed in float32 whatever the model's precision (fp16 beam scores drift).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from service.runtime.contract import SEARCH_INPUTS, SEARCH_OUTPUTS

__all__ = ["SEARCH_INPUTS", "SEARCH_OUTPUTS", "add_search_head", "ban_and_rank_nodes"]

HEAD_PREFIX = "search_head/"
# Ids per block of the two-stage ranking (``ban_and_rank_nodes``): about sqrt(V / k) for a
# 58k vocabulary and k near 10, so that neither stage's TopK sees many values.
RANK_BLOCK = 64
MIN_BLOCKED_VOCAB = 4096


def has_search_head(model: onnx.ModelProto) -> bool:
    return any(output.name == "top_ids" for output in model.graph.output)


def rank_block(vocab_size: int | None) -> int | None:
    """The block of ids the ranking maxes over first (``ban_and_rank_nodes``), or None for a
    single TopK: worth it from a few thousand ids up."""
    return RANK_BLOCK if vocab_size is not None and vocab_size >= MIN_BLOCKED_VOCAB else None


def add_search_head(
    model: onnx.ModelProto,
    logits_name: str = "logits",
    vocab_size: int | None = None,
    block: int | None = None,
) -> list[str]:
    """Append the search head to a decoder graph in place; returns the names of its nodes
    (the fp16 variant keeps them in float32). ``block``: rank in blocks of that many ids
    (default ``rank_block(vocab_size)``)."""
    if has_search_head(model):
        return [node.name for node in model.graph.node if node.name.startswith(HEAD_PREFIX)]
    graph = model.graph
    if vocab_size is None:
        vocab_size = _last_dim(graph, logits_name)
    name = lambda suffix: f"{HEAD_PREFIX}{suffix}"  # noqa: E731
    nodes = [
        # logits (N, T, V) -> (N*T, V), float32: Flatten is free where a Gather of the last
        # position copied 30 MB per step at 128 rows of a 58k vocabulary.
        helper.make_node("Flatten", [logits_name], [name("flat_logits_any")], axis=2),
        helper.make_node(
            "Cast", [name("flat_logits_any")], [name("last_logits")], to=TensorProto.FLOAT
        ),
        helper.make_node("LogSoftmax", [name("last_logits")], [name("all_log_probs")], axis=-1),
        *ban_and_rank_nodes(
            HEAD_PREFIX,
            name("all_log_probs"),
            None,
            "top_log_probs",
            "top_ids",
            block=block if block is not None else rank_block(vocab_size),
            vocab_size=vocab_size,
        ),
        helper.make_node(
            "GatherElements", [name("all_log_probs"), "watch_ids"], ["watch_log_probs"], axis=1
        ),
    ]
    for index, node in enumerate(nodes):
        node.name = name(f"{index}_{node.op_type}")
    graph.node.extend(nodes)
    graph.input.extend(
        [
            helper.make_tensor_value_info("top_k", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("banned_ids", TensorProto.INT64, ["batch", "bans"]),
            helper.make_tensor_value_info("watch_ids", TensorProto.INT64, ["batch", "watched"]),
        ]
    )
    graph.output.extend(
        [
            helper.make_tensor_value_info("top_log_probs", TensorProto.FLOAT, ["batch", "k"]),
            helper.make_tensor_value_info("top_ids", TensorProto.INT64, ["batch", "k"]),
            helper.make_tensor_value_info(
                "watch_log_probs", TensorProto.FLOAT, ["batch", "watched"]
            ),
        ]
    )
    return [node.name for node in nodes]


def _last_dim(graph: onnx.GraphProto, output_name: str) -> int | None:
    """The static size of an output's last axis (None where symbolic or unknown)."""
    for output in graph.output:
        if output.name == output_name:
            dims = output.type.tensor_type.shape.dim
            return dims[-1].dim_value or None if dims else None
    return None


def ban_and_rank_nodes(
    prefix: str,
    log_probs: str,
    ids: str | None,
    top_log_probs: str,
    top_ids: str,
    block: int | None = None,
    vocab_size: int | None = None,
) -> list[onnx.NodeProto]:
    """Nodes that rank ``log_probs`` (N, M) with the bans applied: the best ``top_k`` per row
    into ``top_log_probs`` / ``top_ids``. ``ids`` (N, M) names the vocabulary id of each
    column; None: the columns are the ids (the whole vocabulary). Columns must be in id
    order, so that TopK's ties (lower position first) are lower ids first.

    Bans without touching the (N, M) log-probs: the best k + B ids of a row hold its best k
    unbanned ones (at most B are banned), so rank k + B, set the banned among them to -inf and
    rank those (N, k + B) again. Scattering -inf into a copy of the log-probs cost a pass over
    N x V floats per step (3 % of a beam-4 step at 128 rows of a 58k vocabulary). Same values
    and order: positions in the wide ranking follow (log-prob descending, id ascending).

    ``block`` (whole vocabulary only, ``ids`` None, with ``vocab_size``): the wide ranking in
    two stages (``blocked_rank_nodes``), where one TopK over N x V took as long as the
    log-softmax before it."""
    name = lambda suffix: f"{prefix}{suffix}"  # noqa: E731
    constant = lambda suffix, tensor_type, values: helper.make_node(  # noqa: E731
        "Constant",
        [],
        [name(suffix)],
        value=helper.make_tensor(
            name(suffix), tensor_type, [len(values)] if values else [], values or [float("-inf")]
        ),
    )
    wide_positions = name("wide_positions") if ids is not None else name("wide_ids")
    nodes = [
        constant("minus_inf", TensorProto.FLOAT, []),
        constant("one", TensorProto.INT64, [1]),
        constant("axis_bans", TensorProto.INT64, [2]),
        helper.make_node("Shape", ["banned_ids"], [name("banned_shape")]),
        helper.make_node("Gather", [name("banned_shape"), name("one")], [name("ban_count")]),
        helper.make_node("Add", ["top_k", name("ban_count")], [name("wide_k")]),
    ]
    if block is not None and ids is None:
        if vocab_size is None:
            raise ValueError("a blocked ranking needs the vocabulary size")
        nodes += blocked_rank_nodes(prefix, log_probs, name("wide_k"), block, vocab_size)
    else:
        nodes.append(
            helper.make_node(
                "TopK",
                [log_probs, name("wide_k")],
                [name("wide_log_probs"), wide_positions],
                axis=-1,
                largest=1,
                sorted=1,
            )
        )
    if ids is not None:
        nodes.append(
            helper.make_node("GatherElements", [ids, wide_positions], [name("wide_ids")], axis=1)
        )
    nodes += [
        helper.make_node(
            "Unsqueeze", [name("wide_ids"), name("axis_bans")], [name("wide_ids_column")]
        ),  # (N, k+B, 1)
        helper.make_node("Unsqueeze", ["banned_ids", name("one")], [name("banned_row")]),
        helper.make_node(
            "Equal", [name("wide_ids_column"), name("banned_row")], [name("is_ban")]
        ),  # (N, k+B, B)
        helper.make_node("Cast", [name("is_ban")], [name("is_ban_int")], to=TensorProto.INT32),
        helper.make_node(
            "ReduceMax",
            [name("is_ban_int"), name("axis_bans")],
            [name("banned_int")],
            keepdims=0,
        ),  # (N, k+B)
        helper.make_node("Cast", [name("banned_int")], [name("banned")], to=TensorProto.BOOL),
        helper.make_node(
            "Where",
            [name("banned"), name("minus_inf"), name("wide_log_probs")],
            [name("wide_allowed")],
        ),
        helper.make_node(
            "TopK",
            [name("wide_allowed"), "top_k"],
            [top_log_probs, name("top_positions")],
            axis=-1,
            largest=1,
            sorted=1,
        ),
        helper.make_node(
            "GatherElements", [name("wide_ids"), name("top_positions")], [top_ids], axis=1
        ),
    ]
    return nodes


def blocked_rank_nodes(
    prefix: str, log_probs: str, wide_k: str, block: int, vocab_size: int
) -> list[onnx.NodeProto]:
    """``log_probs`` (N, V) -> ``wide_log_probs``, ``wide_ids`` (N, wide_k): TopK's answer,
    ties included, in two stages.

    ONNX Runtime's CPU TopK compares value by value (a pass over N x V at a fraction of memory
    speed); a max over blocks of ``block`` ids (ReduceMax where blocks divide V, else MaxPool:
    vectorised) is one fast pass. Then:

    1. rank the G = ceil(V / block) block maxima and keep the best min(wide_k, G) blocks;
    2. rank their ids (in id order: the blocks sorted by index) and keep the best wide_k.

    Exact: an id among the row's best wide_k (log-prob descending, id ascending) lies in a kept
    block, because every block ranked above its block holds an id ranked above it (its max:
    larger, or equal with a lower id), and fewer than wide_k ids rank above it. Ids past V in
    the last block read log-prob -inf and come last among equals (they are the highest)."""
    name = lambda suffix: f"{prefix}{suffix}"  # noqa: E731
    constant = lambda suffix, tensor: helper.make_node(  # noqa: E731
        "Constant", [], [name(suffix)], value=tensor
    )
    ints = lambda suffix, values, dims: constant(  # noqa: E731
        suffix, helper.make_tensor(name(suffix), TensorProto.INT64, dims, values)
    )
    node = helper.make_node
    if vocab_size % block == 0:
        # Whole blocks: the maxima are a ReduceMax over (N, G, block), about 1.6x faster than
        # MaxPool's pass over the same values in ONNX Runtime 1.32 (256 x 8,000 log-probs).
        block_maxima = [
            ints("blocks_shape", [-1, vocab_size // block, block], [3]),
            ints("last_axis", [-1], [1]),
            node("Reshape", [log_probs, name("blocks_shape")], [name("as_blocks")]),
            node(
                "ReduceMax", [name("as_blocks"), name("last_axis")], [name("block_max")], keepdims=0
            ),
        ]  # (N, G)
    else:
        block_maxima = [
            ints("block_axis", [1], [1]),
            node("Unsqueeze", [log_probs, name("block_axis")], [name("as_signal")]),  # (N, 1, V)
            node(
                "MaxPool",
                [name("as_signal")],
                [name("block_max_signal")],
                kernel_shape=[block],
                strides=[block],
                ceil_mode=1,
            ),  # (N, 1, G): the last block may be short
            node("Squeeze", [name("block_max_signal"), name("block_axis")], [name("block_max")]),
        ]
    return [
        ints("id_axis", [2], [1]),
        ints("block_size", [block], []),
        ints("last_id", [vocab_size - 1], []),
        ints("vocab_size", [vocab_size], []),
        ints("offsets", list(range(block)), [1, 1, block]),
        ints("flat_candidates", [0, -1], [2]),
        *block_maxima,
        node("Shape", [name("block_max")], [name("block_count")], start=1),  # [G]
        node("Min", [wide_k, name("block_count")], [name("kept_blocks")]),
        node(
            "TopK",
            [name("block_max"), name("kept_blocks")],
            [name("unused_maxima"), name("best_blocks")],
            axis=-1,
            largest=1,
            sorted=1,
        ),
        node(
            "TopK",
            [name("best_blocks"), name("kept_blocks")],
            [name("blocks_in_order"), name("unused_positions")],
            axis=-1,
            largest=0,
            sorted=1,
        ),  # (N, b) block indices ascending, so candidates are in id order
        node("Unsqueeze", [name("blocks_in_order"), name("id_axis")], [name("block_column")]),
        node("Mul", [name("block_column"), name("block_size")], [name("block_starts")]),
        node("Add", [name("block_starts"), name("offsets")], [name("candidate_grid")]),
        node(
            "Reshape", [name("candidate_grid"), name("flat_candidates")], [name("candidates")]
        ),  # (N, b * block)
        node("Min", [name("candidates"), name("last_id")], [name("readable")]),
        node("GatherElements", [log_probs, name("readable")], [name("read")], axis=1),
        node("Less", [name("candidates"), name("vocab_size")], [name("in_vocab")]),
        node("Where", [name("in_vocab"), name("read"), name("minus_inf")], [name("scored")]),
        node(
            "TopK",
            [name("scored"), wide_k],
            [name("wide_log_probs"), name("wide_places")],
            axis=-1,
            largest=1,
            sorted=1,
        ),
        node(
            "GatherElements",
            [name("candidates"), name("wide_places")],
            [name("wide_ids")],
            axis=1,
        ),
    ]
