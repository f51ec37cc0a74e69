"""A running group: requests that share one dense batch, and so one decoder call per step.

Rows: every request occupies ``search.num_rows`` contiguous rows (1 greedy, K beams; one
before a beam search's first step, which the K beams then continue), in the order the
requests joined but for rows that left (below). The group's tensors (``GroupTensors``) are
the self-attention cache (N, H, P, Dh), the cross K/V (N, H, S, Dh), wherever the model's KV
backend keeps them, and two small host masks, with each row's next input token and position.
Per-request state lives in one small object per request (``ActiveRequest``,
service/runtime/stepping.py).

A ``Group`` owns everything that changes its tensors: merging another group into it, the step
inputs, advancing its searches by one decoder output, and rearranging rows when beams reorder
or requests leave. The engine (service/runtime/engine.py) decides which groups exist; a group
never looks at another one except the one merged into it.

Rows join a running group late: their self-attention cache slots to the left of their first
token are invalid (zeros, masked out by ``self_attention_mask``); their source is zero-padded
on the right to the group's S (masked by ``encoder_attention_mask``). Each row feeds its own
position (the number of tokens it has generated), so a translation does not depend on its
batch. After every step finished requests leave at once (in a group of one-row requests the
last rows move into the rows that left, so a finished request costs one row's copy), and columns
no remaining row needs are trimmed (left cache slots that are invalid for every row, source
padding beyond the longest remaining source).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from service.runtime.feeds import BanFeeds
from service.runtime.kv_cache import KVBackend, KVCache
from service.runtime.model_io import ModelInfo, StepInputs, StepOutput
from service.runtime.step_cost import StepShape
from service.runtime.stepping import ActiveRequest, advance_searches
from service.runtime.types import FinishedRequest, RejectedRequest


@dataclass
class GroupTensors:
    """A group's batched tensors. N rows, P cached target positions, S source positions."""

    self_cache: KVCache  # 2L x (N, H, P, Dh) (+ spare slots), where the KV backend keeps them
    cross_cache: KVCache  # 2L x (N, H, S, Dh)
    self_mask: np.ndarray  # (N, P) int64, 1 where a cache slot holds a real token
    encoder_mask: np.ndarray  # (N, S) int64
    next_tokens: np.ndarray  # (N,) int64: each row's input at the next step
    positions: np.ndarray  # (N,) int64: its position (the tokens its request has generated)


@dataclass(frozen=True)
class GroupSpan:
    """What placement sees of a group: its step shape and its shortest source."""

    shape: StepShape
    shortest: int


@dataclass
class EncodedRequests:
    """``Engine.encode``'s result, for ``Engine.place``: encoded newcomers, one group per
    length class, and the requests refused."""

    groups: list[Group]
    rejected: list[RejectedRequest]

    @property
    def request_ids(self) -> list[Hashable]:
        return [active.request.request_id for group in self.groups for active in group.requests]


class Group:
    """Requests that share one dense batch (one decoder call per step)."""

    def __init__(self, kv: KVBackend, requests: list[ActiveRequest], tensors: GroupTensors):
        self.kv = kv
        self.tensors = tensors
        self.last_decode_s = 0.0  # the decoder call of the last step (the engine's timeline)
        self._feeds = BanFeeds()
        self._set_requests(requests)

    def _set_requests(self, requests: list[ActiveRequest]) -> None:
        """What the step inputs need of the requests, kept until they change."""
        self.requests = requests
        self.rows = sum(active.num_rows for active in requests)
        self._top_k = max((active.search.top_k for active in requests), default=1)
        self._constrained = any(active.search.constraint is not None for active in requests)

    @property
    def past_len(self) -> int:
        return int(self.tensors.self_mask.shape[1])

    @property
    def width(self) -> int:
        return int(self.tensors.encoder_mask.shape[1])

    @property
    def shortest(self) -> int:
        return min(active.src_len for active in self.requests)

    @property
    def shape(self) -> StepShape:
        return StepShape(self.rows, self.past_len, self.width)

    @property
    def span(self) -> GroupSpan:
        return GroupSpan(self.shape, self.shortest)

    def release(self) -> None:
        """The caches go back to the backend for reuse (the group is empty and retires)."""
        self.kv.release(self.tensors.self_cache)
        self.kv.release(self.tensors.cross_cache)

    def absorb(self, other: Group) -> None:
        """``other``'s rows after this group's: self caches left-padded to the longer past
        (invalid slots, masked), sources right-padded to the wider source."""
        a, b = self.tensors, other.tensors
        past_len = max(a.self_mask.shape[1], b.self_mask.shape[1])
        width = max(a.encoder_mask.shape[1], b.encoder_mask.shape[1])
        self.tensors = GroupTensors(
            self_cache=self.kv.merge(a.self_cache, b.self_cache, past_len, left=True),
            cross_cache=self.kv.merge(a.cross_cache, b.cross_cache, width, left=False),
            self_mask=np.concatenate(
                [
                    _pad_columns(a.self_mask, past_len, left=True),
                    _pad_columns(b.self_mask, past_len, left=True),
                ]
            ),
            encoder_mask=np.concatenate(
                [_pad_columns(a.encoder_mask, width), _pad_columns(b.encoder_mask, width)]
            ),
            next_tokens=np.concatenate([a.next_tokens, b.next_tokens]),
            positions=np.concatenate([a.positions, b.positions]),
        )
        self._set_requests(self.requests + other.requests)

    def step_inputs(self, info: ModelInfo, static_bans: list[int]) -> StepInputs:
        """The next decoder call's inputs: every row's token and position, the masks, and
        the ids each row may not emit (``static_bans`` and its search's own)."""
        rows, tensors = self.rows, self.tensors
        banned, watch = self._feeds.arrays(
            self.requests, rows, info.pad_id, static_bans, self._constrained
        )
        return StepInputs(
            input_ids=tensors.next_tokens[:, None],
            positions=tensors.positions[:, None],
            self_attention_mask=np.concatenate(
                [tensors.self_mask, np.ones((rows, 1), dtype=np.int64)], axis=1
            ),  # (N, P+1)
            encoder_attention_mask=tensors.encoder_mask,
            top_k=min(self._top_k, info.vocab_size),
            banned_ids=banned,
            watch_ids=watch,
        )

    def step(self, info: ModelInfo, static_bans: list[int]) -> list[FinishedRequest]:
        """One decoder call; every search advances; finished requests leave."""
        inputs = self.step_inputs(info, static_bans)
        tensors = self.tensors
        started = time.perf_counter()
        head, present = self.kv.decode(inputs, tensors.self_cache, tensors.cross_cache)
        self.last_decode_s = time.perf_counter() - started
        tensors.self_cache, tensors.self_mask = present, inputs.self_attention_mask
        return self.advance(head)

    def advance(self, head: StepOutput) -> list[FinishedRequest]:
        """Every search advances by ``head``; beams continue their parents' caches and the
        rows of finished requests leave."""
        step = advance_searches(self.requests, head)
        tensors = self.tensors
        own = step.own_rows
        tensors.next_tokens = step.next_tokens
        tensors.positions = (tensors.positions if own is None else tensors.positions[own]) + 1
        if step.kept_rows is not None or own is not None:  # requests finished or expanded
            rows = len(step.next_tokens)
            kept = np.arange(rows) if step.kept_rows is None else np.flatnonzero(step.kept_rows)
            remaining = step.remaining
            if own is None and len(kept) < rows and all(a.num_rows == 1 for a in remaining):
                kept, remaining = _holes_filled_from_the_end(kept, remaining)
            self._set_requests(remaining)
            tensors.next_tokens = tensors.next_tokens[kept]
            tensors.positions = tensors.positions[kept]
            own_kept = kept if own is None else own[kept]
            self.rearrange(step.parent_rows[kept], own_kept, rows_left=True)
        elif step.reordered:
            self.rearrange(step.parent_rows, step.parent_rows, rows_left=False)
        return step.finished

    def drop(self, request_ids: set[Hashable]) -> None:
        """Cancelled requests leave (unknown ids are ignored)."""
        kept = [active.request.request_id not in request_ids for active in self.requests]
        if all(kept):
            return
        rows = np.flatnonzero(np.repeat(kept, [active.num_rows for active in self.requests]))
        self._set_requests(
            [active for active, keep in zip(self.requests, kept, strict=True) if keep]
        )
        self.tensors.next_tokens = self.tensors.next_tokens[rows]
        self.tensors.positions = self.tensors.positions[rows]
        self.rearrange(rows, rows, rows_left=True)

    def rearrange(self, cache_rows: np.ndarray, own_rows: np.ndarray, rows_left: bool) -> None:
        """Gather the self-attention cache rows ``cache_rows`` (beam reorder, retire, a beam
        search's first row repeated for its K beams) and trim columns; ``own_rows``: a row of
        each row's own request, unpermuted (for the cross cache, which beams share).
        ``rows_left``: the rows are not the step's rows in order (some left or repeat). No
        copy at all when nothing moved."""
        tensors = self.tensors
        if not self.requests:
            return
        num_rows, past_len = tensors.self_mask.shape
        rows = cache_rows
        start = 0
        if rows_left:
            # Left cache slots invalid for every remaining row (only rows that left used them)
            # are dropped. Only rows leaving can create such slots: a request's beams share
            # one mask (reordering them changes nothing), and newcomers' invalid slots lie
            # under the valid ones of the rows they joined.
            start = int(tensors.self_mask[rows].any(axis=0).argmax())
        if start > 0 or len(rows) != num_rows or not (rows == np.arange(num_rows)).all():
            tensors.self_cache = self.kv.select(tensors.self_cache, rows, start, past_len)
            tensors.self_mask = tensors.self_mask[rows, start:]
        if rows_left:
            # A request's beams share identical cross K/V: its own rows, unpermuted, suffice.
            end = max(active.src_len for active in self.requests)
            tensors.cross_cache = self.kv.select(tensors.cross_cache, own_rows, 0, end)
            tensors.encoder_mask = tensors.encoder_mask[own_rows, :end]


def _holes_filled_from_the_end(
    kept: np.ndarray, remaining: list[ActiveRequest]
) -> tuple[np.ndarray, list[ActiveRequest]]:
    """One-row requests left in rows ``kept`` (ascending) of the step: the rows they occupy
    next, each row that left filled by a row from the end, and the requests in that order.

    Moving every row after a gap down copies half the batch's caches on average whenever a
    request finishes (nearly every step under load); filling the gaps from the end copies
    one row per request that left. Rows are a request's own (its position, its masks), so
    their order in the batch changes no translation."""
    count = len(kept)
    stays = kept < count  # these keep their row
    order = np.arange(count)
    order[np.setdiff1d(order, kept[stays], assume_unique=True)] = kept[~stays]
    index_of_row = np.searchsorted(kept, order)  # row of the step -> its remaining request
    return order, [remaining[index] for index in index_of_row.tolist()]


def _pad_columns(mask: np.ndarray, width: int, left: bool = False) -> np.ndarray:
    """(N, S) -> (N, width), zeros on the right (or on the left)."""
    if mask.shape[1] == width:
        return mask
    padded = np.zeros((mask.shape[0], width), dtype=mask.dtype)
    if left:
        padded[:, width - mask.shape[1] :] = mask
    else:
        padded[:, : mask.shape[1]] = mask
    return padded
