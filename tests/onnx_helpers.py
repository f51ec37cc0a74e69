"""Helpers shared by the export and engine tests (plain functions; fixtures are in
tests/onnx_fixtures.py, loaded as a pytest plugin)."""

from __future__ import annotations

import torch

from models.transformer import Transformer


def padded_sources(model: Transformer, lengths: list[int], seed: int = 3):
    """Source ids (B, S) ending in eos, right-padded, their mask, and the unpadded lists."""
    from export.verify import padded_source

    src_ids, src_mask = padded_source(lengths, model, seed=seed)
    sources = [row[: int(mask.sum())].tolist() for row, mask in zip(src_ids, src_mask, strict=True)]
    return src_ids, src_mask, sources


def reference(
    model: Transformer,
    sources: list[list[int]],
    beam_size: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    suppress_ids: tuple[int, ...] | None = None,
):
    """models.search on each sentence alone (no padding at all): the batch-independent truth.
    Like the engine, it never generates the unknown token (unless ``suppress_ids`` says)."""
    from models.search import beam_search, greedy_search

    suppress = (model.config.unk_id,) if suppress_ids is None else suppress_ids
    outputs = []
    for source in sources:
        src_ids = torch.tensor([source])
        src_mask = torch.ones_like(src_ids)
        if beam_size == 1:
            outputs += greedy_search(
                model, src_ids, src_mask, max_new_tokens=max_new_tokens, suppress_ids=suppress
            )
        else:
            outputs += beam_search(
                model,
                src_ids,
                src_mask,
                beam_size=beam_size,
                max_new_tokens=max_new_tokens,
                length_penalty=length_penalty,
                suppress_ids=suppress,
            )
    return outputs
