"""A running group: requests that share one dense batch, and so one decoder call per step.

Rows: every request occupies ``search.num_rows`` contiguous rows (1 greedy, K beams), in the
order the requests joined. The group's tensors (``GroupTensors``) are the self-attention cache
(N, H, P, Dh), the cross K/V (N, H, S, Dh), wherever the model's KV backend keeps them, and two
small host masks. Per-request state lives in one small object per request (``ActiveRequest``).

A ``Group`` owns everything that changes its tensors: merging another group into it, the step
inputs, advancing its searches by one decoder output, and rearranging rows when beams reorder
or requests leave. The engine (service/runtime/engine.py) decides which groups exist; a group
never looks at another one except the one merged into it.

Rows join a running group late: their self-attention cache slots to the left of their first
token are invalid (zeros, masked out by ``self_attention_mask``); their source is zero-padded
on the right to the group's S (masked by ``encoder_attention_mask``). Each row feeds its own
position (the number of tokens it has generated), so a translation does not depend on its
batch. After every step finished requests leave at once, and columns no remaining row needs are
trimmed (left cache slots that are invalid for every row, source padding beyond the longest
remaining source).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from service.runtime.kv_cache import KVBackend, KVCache
from service.runtime.model_io import ModelInfo, StepInputs, StepOutput
from service.runtime.search import BeamSearch, GreedySearch, make_search
from service.runtime.step_cost import StepShape
from service.runtime.types import DecodeRequest, FinishedRequest, RejectedRequest


@dataclass
class ActiveRequest:
    """A request in a group: its search and the tokens it feeds at the next step."""

    request: DecodeRequest
    search: GreedySearch | BeamSearch
    src_len: int
    next_tokens: np.ndarray  # (rows,) int64: fed at the next step
    steps: int = 0  # decoder steps so far = position of the next input token

    @property
    def num_rows(self) -> int:
        return self.search.num_rows


@dataclass
class GroupTensors:
    """A group's batched tensors. N rows, P cached target positions, S source positions."""

    self_cache: KVCache  # 2L x (N, H, P, Dh) (+ spare slots), where the KV backend keeps them
    cross_cache: KVCache  # 2L x (N, H, S, Dh)
    self_mask: np.ndarray  # (N, P) int64, 1 where a cache slot holds a real token
    encoder_mask: np.ndarray  # (N, S) int64


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
        self.requests = requests
        self.tensors = tensors
        self.rows = sum(active.num_rows for active in requests)
        self.last_decode_s = 0.0  # the decoder call of the last step (the engine's timeline)
        self._static_key: tuple | None = None  # what ``_static_arrays`` were built for
        self._static_arrays: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))

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
        )
        self.requests.extend(other.requests)
        self.rows += other.rows

    def step_inputs(self, info: ModelInfo, static_bans: list[int]) -> StepInputs:
        """The next decoder call's inputs: every row's token and position, the masks, and
        the ids each row may not emit (``static_bans`` and its search's own)."""
        rows = self.rows
        extra_bans = [active.search.bans() for active in self.requests]
        watched = [active.search.watch_ids() for active in self.requests]
        if all(b is None for b in extra_bans) and all(w is None for w in watched):
            banned, watch = self._static_bans(rows, info.pad_id, static_bans)
        else:
            banned, watch = self._bans(rows, info.pad_id, static_bans, extra_bans, watched)
        steps = np.array([active.steps for active in self.requests], dtype=np.int64)
        row_counts = [active.num_rows for active in self.requests]
        return StepInputs(
            input_ids=np.concatenate([active.next_tokens for active in self.requests])[:, None],
            positions=np.repeat(steps, row_counts)[:, None],
            self_attention_mask=np.concatenate(
                [self.tensors.self_mask, np.ones((rows, 1), dtype=np.int64)], axis=1
            ),  # (N, P+1)
            encoder_attention_mask=self.tensors.encoder_mask,
            top_k=min(max(active.search.top_k for active in self.requests), info.vocab_size),
            banned_ids=banned,
            watch_ids=watch,
        )

    def _static_bans(
        self, rows: int, pad_id: int, static_bans: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bans and watched ids when no search adds its own (the usual step): the same
        arrays step after step while the rows stay, built once (the graph only reads them)."""
        key = (rows, pad_id, tuple(static_bans))
        if self._static_key != key:
            banned = np.empty((rows, len(static_bans)), dtype=np.int64)
            banned[:] = static_bans
            self._static_arrays = (banned, np.full((rows, 1), pad_id, dtype=np.int64))
            self._static_key = key
        return self._static_arrays

    def _bans(
        self,
        rows: int,
        pad_id: int,
        static_bans: list[int],
        extra_bans: list[np.ndarray | None],
        watched: list[np.ndarray | None],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bans and watched ids when some search adds its own (placeholder constraints)."""
        ban_width = max((b.shape[1] for b in extra_bans if b is not None), default=0)
        banned = np.full((rows, len(static_bans) + ban_width), pad_id, dtype=np.int64)
        banned[:, : len(static_bans)] = static_bans
        # A search that watches ids also sees its row's bans after them: it can tell the
        # argmax before them (service/runtime/search.py).
        watch_width = max((len(w) + len(static_bans) for w in watched if w is not None), default=1)
        watch = np.full((rows, watch_width), pad_id, dtype=np.int64)
        offset = 0
        for active, bans, ids in zip(self.requests, extra_bans, watched, strict=True):
            end = offset + active.num_rows
            if bans is not None:
                banned[offset:end, len(static_bans) : len(static_bans) + bans.shape[1]] = bans
            if ids is not None:
                watch[offset:end, : len(ids)] = ids
                watch[offset:end, len(ids) : len(ids) + len(static_bans)] = static_bans
            offset = end
        return banned, watch

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
        finished: list[FinishedRequest] = []
        remaining: list[ActiveRequest] = []
        # per remaining request: its first row and the rows its beams continue (None: its own,
        # in order, as greedy rows always do)
        kept: list[tuple[int, np.ndarray | None]] = []
        # Greedy rows that follow the head take its best id from one list: a row's share of the
        # host's work is what bounds a step where the decoder call is flat in rows (a GPU).
        best_ids = head.top_ids[:, 0].tolist()
        offset = 0
        for active in self.requests:
            rows = active.num_rows
            search = active.search
            parents: np.ndarray | None = None
            if isinstance(search, GreedySearch) and search.follows_head():
                token = best_ids[offset]
                search.take(token)
                next_tokens = np.array([token], dtype=np.int64)
            else:
                next_tokens, parents = search.advance(head.rows(offset, offset + rows))
                if rows == 1 or (parents == np.arange(rows)).all():
                    parents = None
            active.steps += 1
            if search.done:
                finished.append(
                    FinishedRequest(
                        active.request.request_id,
                        search.result(),
                        active.steps,
                        search.hypotheses(),
                    )
                )
            else:
                active.next_tokens = next_tokens
                remaining.append(active)
                kept.append((offset, parents))
            offset += rows
        self.requests = remaining
        self.rows = sum(active.num_rows for active in remaining)
        if finished or any(parents is not None for _, parents in kept):
            own_rows = [
                first + np.arange(active.num_rows)
                for active, (first, _) in zip(remaining, kept, strict=True)
            ]
            cache_rows = [
                own if continued is None else first + continued
                for own, (first, continued) in zip(own_rows, kept, strict=True)
            ]
            self.rearrange(cache_rows, own_rows, rows_left=len(finished) > 0)
        return finished

    def drop(self, request_ids: set[Hashable]) -> None:
        """Cancelled requests leave (unknown ids are ignored)."""
        remaining, kept_rows = [], []
        offset = 0
        for active in self.requests:
            if active.request.request_id not in request_ids:
                remaining.append(active)
                kept_rows.append(offset + np.arange(active.num_rows))
            offset += active.num_rows
        if len(remaining) == len(self.requests):
            return
        self.requests = remaining
        self.rows = sum(active.num_rows for active in remaining)
        self.rearrange(kept_rows, kept_rows, rows_left=True)

    def rearrange(
        self, cache_rows: list[np.ndarray], own_rows: list[np.ndarray], rows_left: bool
    ) -> None:
        """Gather the self-attention cache rows (beam reorder, retire) and trim columns; no
        copy at all when nothing moved (greedy rows, beams that kept their order)."""
        tensors = self.tensors
        if not self.requests:
            return
        num_rows, past_len = tensors.self_mask.shape
        rows = np.concatenate(cache_rows)
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
            cross_rows = np.concatenate(own_rows)
            end = max(active.src_len for active in self.requests)
            tensors.cross_cache = self.kv.select(tensors.cross_cache, cross_rows, 0, end)
            tensors.encoder_mask = tensors.encoder_mask[cross_rows, :end]


def encode_group(kv: KVBackend, info: ModelInfo, requests: list[DecodeRequest]) -> Group:
    """One encoder call for requests of similar source length: a group of their own, with an
    empty self-attention cache (not in the batch yet)."""
    src_len = max(len(request.src_ids) for request in requests)
    input_ids = np.full((len(requests), src_len), info.pad_id, dtype=np.int64)  # (M, S')
    attention_mask = np.zeros((len(requests), src_len), dtype=np.int64)
    for row, request in enumerate(requests):
        input_ids[row, : len(request.src_ids)] = request.src_ids
        attention_mask[row, : len(request.src_ids)] = 1
    cross = kv.encode(input_ids, attention_mask)  # 2L x (M, H, S', Dh)

    newcomers = [
        ActiveRequest(
            request=request,
            search=make_search(request, info),
            src_len=len(request.src_ids),
            next_tokens=np.full(request.beam_size, info.decoder_start_id, dtype=np.int64),
        )
        for request in requests
    ]
    repeats = np.array([active.num_rows for active in newcomers])
    new_rows = int(repeats.sum())
    if new_rows != len(requests):  # beams share their sentence's cross K/V: repeat rows
        cross = kv.select(cross, np.repeat(np.arange(len(requests)), repeats), 0, src_len)
    return Group(
        kv,
        newcomers,
        GroupTensors(
            self_cache=kv.empty(new_rows),
            cross_cache=cross,
            self_mask=np.zeros((new_rows, 0), dtype=np.int64),
            encoder_mask=np.repeat(attention_mask, repeats, axis=0),  # (R, S')
        ),
    )


def encode_calls(kv: KVBackend, info: ModelInfo, calls: list[list[DecodeRequest]]) -> Group:
    """A length class encoded in ``calls`` (``placement.encoder_calls``) and joined into one
    group: the narrower calls' cross caches right-padded to the widest, a copy and no encoder
    work."""
    parts = [encode_group(kv, info, call) for call in calls]
    while len(parts) > 1:  # pairwise, so a row is copied about log2(len(calls)) times
        for first, second in zip(parts[::2], parts[1::2], strict=False):
            first.absorb(second)
        parts = parts[::2]
    return parts[0]


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
