"""A numpy mirror of the decoder's search head (export/search_head.py), for search-level
tests on synthetic logits and for checking the graph's head against it."""

from __future__ import annotations

import numpy as np

from service.runtime.model_io import StepOutput


def head_from_logits(
    logits: np.ndarray,
    top_k: int,
    banned: list[int] | np.ndarray,
    extra_bans: np.ndarray | None = None,
    watch_ids: np.ndarray | None = None,
) -> StepOutput:
    """logits (N, V) -> what the graph's head returns: log-softmax, bans (``banned`` for every
    row, ``extra_bans`` (N, b) per row) set to -inf, sorted top k (ties: lower id first), and
    the log-probs before the bans at ``watch_ids`` (W,) followed by ``banned`` (as the engine
    watches them)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    unbanned = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_probs = unbanned.copy()
    log_probs[:, list(banned)] = -np.inf
    if extra_bans is not None:
        np.put_along_axis(log_probs, np.asarray(extra_bans), -np.inf, axis=1)
    order = np.argsort(-log_probs, axis=1, kind="stable")[:, :top_k]
    watched = np.zeros(1, dtype=np.int64) if watch_ids is None else np.append(watch_ids, banned)
    return StepOutput(
        np.take_along_axis(log_probs, order, axis=1).astype(np.float32),
        order.astype(np.int64),
        unbanned[:, watched].astype(np.float32),
        np.tile(watched, (len(logits), 1)),
    )


def advance_on_logits(search, logits: np.ndarray, pad_id: int):
    """One ``search.advance`` on full logits (rows, V), the way the engine feeds it."""
    head = head_from_logits(
        logits, search.top_k, [pad_id], extra_bans=search.bans(), watch_ids=search.watch_ids()
    )
    return search.advance(head)
