"""The running batch that the continuous batcher drives: add requests, step, retire, drop.

Rows: every request occupies ``search.num_rows`` contiguous rows (1 greedy, K beams), in the
order the requests joined. Batched state lives in one place per group (``_Batch``): the
self-attention cache (N, H, P, Dh) and cross K/V (N, H, S, Dh), wherever the model's KV backend
keeps them (service/runtime/onnx_model.py: numpy on the host, OrtValues on the device; the engine only
calls the backend's operations), and two small host masks. Per-request state lives in one
small object per request (``_Active``).

Groups: rows that joined at about the same time *and* have sources of about the same length
share one dense batch (one decoder call per group and step). A newcomer is then padded neither
to the past length of a row that has decoded for a hundred steps nor to a paragraph's source:
a UI string never attends over a paragraph's padding. Newcomers are split into length classes
(one encoder call each) and each class joins a group of its age and length, or opens one (at
most ``max_groups``; beyond that, the group it pads least); groups whose pasts and lengths come
close merge. The same on both KV backends.

Every decoder call's duration is reported to ``step_cost`` (service/runtime/step_cost.py), which the
batcher asks what a step of a given shape will cost before it admits newcomers.

Rows join a running batch late: their self-attention cache slots to the left of their first
token are invalid (zeros, masked out by ``self_attention_mask``); their source is zero-padded
on the right to the batch's S (masked by ``encoder_attention_mask``). Each row feeds its own
position (the number of tokens it has generated), so a translation does not depend on its
batch. After every step finished requests leave at once, and columns no remaining row needs
are trimmed (left cache slots that are invalid for every row, source padding beyond the
longest remaining source).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime.buffer_pool import DEFAULT_MAX_FREE_BYTES
from service.runtime.onnx_model import (
    KVBackendName,
    KVCache,
    OnnxSeq2Seq,
    ProviderName,
    StepInputs,
    StepOutput,
)
from service.runtime.search import BeamSearch, GreedySearch, make_search
from service.runtime.step_cost import StepCostModel, StepShape

log = logging.getLogger(__name__)


@dataclass
class DecodeRequest:
    """One sentence to decode; the batcher submits these as they are."""

    request_id: Hashable = None  # the batcher sets it when it queues the sentence
    src_ids: list[int] | tuple[int, ...] = ()  # already tokenized, ends with eos
    beam_size: int = 1
    max_new_tokens: int = 128
    length_penalty: float = 1.0
    # Placeholder constraint (service/runtime/search.py, CopyConstraint): every placeholder-symbol
    # id of the vocabulary -> how often the source has it (0: never emit it). None: none.
    copy_tokens: dict[int, int] | None = None
    # Ids generated first whatever the model prefers, then stripped (search.py): a
    # multilingual model's target-language code. Per row: rows of any languages share steps.
    forced_prefix: tuple[int, ...] = ()


@dataclass
class FinishedRequest:
    request_id: Hashable
    tokens: list[int]  # generated ids, no start token, no eos
    steps: int  # decoder steps this request took part in
    hypotheses: list[list[int]] = field(default_factory=list)  # n-best, best first


@dataclass(frozen=True)
class BatchEstimate:
    """The running batch as ``Engine.estimate`` foresees it (for the batcher's admission)."""

    rows: int
    padded_tokens: int  # sum over groups of rows x (past + padded source)
    row_limit: int | None = None  # rows past which tokens/s fall (step-cost model), or None


@dataclass
class EncodedRequests:
    """``Engine.encode``'s result, for ``Engine.place``: encoded newcomers, one group per
    length class, and the requests refused."""

    groups: list[_Group]
    rejected: list[RejectedRequest]

    @property
    def request_ids(self) -> list[Hashable]:
        return [active.request.request_id for group in self.groups for active in group.requests]


@dataclass(frozen=True)
class RejectedRequest:
    """A request ``Engine.add`` refused; the others admitted with it proceed."""

    request_id: Hashable
    reason: str


@dataclass
class _Active:
    request: DecodeRequest
    search: GreedySearch | BeamSearch
    src_len: int
    next_tokens: np.ndarray  # (rows,) int64: fed at the next step
    steps: int = 0  # decoder steps so far = position of the next input token

    @property
    def num_rows(self) -> int:
        return self.search.num_rows


@dataclass
class _Batch:
    """All batched tensors. N rows, P cached target positions, S source positions."""

    self_cache: KVCache  # 2L x (N, H, P, Dh) (+ spare slots), where the KV backend keeps them
    cross_cache: KVCache  # 2L x (N, H, S, Dh)
    self_mask: np.ndarray  # (N, P) int64, 1 where a cache slot holds a real token
    encoder_mask: np.ndarray  # (N, S) int64


@dataclass(eq=False)
class _Group:
    """Requests that share one dense batch (one decoder call per step)."""

    requests: list[_Active]
    batch: _Batch
    rows: int = -1

    def __post_init__(self) -> None:
        if self.rows < 0:
            self.rows = sum(active.num_rows for active in self.requests)

    @property
    def past_len(self) -> int:
        return self.batch.self_mask.shape[1]

    @property
    def width(self) -> int:
        return self.batch.encoder_mask.shape[1]

    @property
    def shortest(self) -> int:
        return min(active.src_len for active in self.requests)

    @property
    def shape(self) -> StepShape:
        return StepShape(self.rows, self.past_len, self.width)


def similar_lengths(shortest: int, longest: int, slack: int) -> bool:
    """Sources that may share a padded batch: the padding stays below about half of it."""
    return longest - shortest <= max(slack, shortest)


@dataclass(frozen=True)
class EngineConfig:
    """How an engine opens its export (service/wiring.py builds it from the settings)."""

    provider: ProviderName = "auto"
    intra_op_threads: int = 0  # 0: ONNX Runtime's default
    kv_pool_bytes: int = DEFAULT_MAX_FREE_BYTES
    vocab_screen: bool = True


@dataclass
class Engine:
    model: OnnxSeq2Seq
    model_dir: Path
    model_name: str = ""
    steps: int = 0
    # Groups (module docstring). Newcomers join a group whose past is at most ``merge_past``
    # and whose sources are of similar length (``similar_lengths`` with ``length_slack``);
    # groups that come that close merge. ``max_groups`` = 1: one batch for everyone.
    max_groups: int = 4
    merge_past: int = 8
    length_slack: int = 8
    # Never generate the unknown token: it cannot be turned back into the text it replaced.
    ban_unk: bool = True
    step_cost: StepCostModel = field(default_factory=StepCostModel)
    _groups: list[_Group] = field(default_factory=list)

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        provider: ProviderName = "auto",
        intra_op_threads: int = 0,
        kv_backend: KVBackendName | None = None,
        kv_pool_bytes: int = DEFAULT_MAX_FREE_BYTES,
        vocab_screen: bool = True,
        **options: Any,
    ) -> Engine:
        """``kv_backend``, ``kv_pool_bytes``, ``vocab_screen``: see ``OnnxSeq2Seq`` (default:
        host caches exactly on CPU, the export's int8 screen of greedy steps); ``options``: the
        dataclass's scheduling fields (max_groups, merge_past, ...)."""
        model = OnnxSeq2Seq(
            model_dir,
            provider=provider,
            intra_op_threads=intra_op_threads,
            kv_backend=kv_backend,
            kv_pool_bytes=kv_pool_bytes,
            vocab_screen=vocab_screen,
        )
        return cls(
            model=model, model_dir=Path(model_dir), model_name=model.info.model_name, **options
        )

    @classmethod
    def from_config(cls, model_dir: str | Path, config: EngineConfig) -> Engine:
        return cls.from_dir(model_dir, **dataclasses.asdict(config))

    # --- read-only properties --------------------------------------------------------------

    @property
    def provider(self) -> str:
        """The provider actually in use ("cuda" or "cpu")."""
        return self.model.provider

    @property
    def kv(self):
        return self.model.kv

    @property
    def active_requests(self) -> int:
        return sum(len(group.requests) for group in self._groups)

    @property
    def active_rows(self) -> int:
        return sum(group.rows for group in self._groups)

    @property
    def groups(self) -> int:
        return len(self._groups)

    @property
    def step_shapes(self) -> list[StepShape]:
        """One decoder call per group at the next step."""
        return [group.shape for group in self._groups]

    def shapes_with(self, newcomers: Iterable[tuple[int, int]]) -> list[StepShape]:
        """The step shapes once newcomers ``(rows, src_len)`` have joined, as ``add`` would
        place them (for the batcher's cost estimate; nothing changes)."""
        placement = _Placement.of(self)
        for rows, src_len in newcomers:
            placement.place(rows, src_len)
        return placement.shapes()

    def estimate(
        self, newcomers: Sequence[tuple[int, int]] = (), max_rows: int = 64, tolerance: float = 0.0
    ) -> BatchEstimate:
        """The batch once newcomers ``(rows, src_len)`` have joined (none: as it is).

        ``row_limit``: by the step-cost model, the most rows a batch of this mean past and
        source length should hold: the largest count (up to ``max_rows``) whose tokens/s stay
        within ``tolerance`` of the best count's (None before the model is fitted)."""
        shapes = self.shapes_with(newcomers) if newcomers else self.step_shapes
        return self._estimate_shapes(shapes, max_rows, tolerance)

    def plan(self, max_rows: int = 64, tolerance: float = 0.0) -> AdmissionPlan:
        """An admission plan over the batch as it is now: the batcher tries units of
        newcomers one after another and takes some; each try costs O(groups), however many
        were taken before, so admission between two steps stays linear in the queue."""
        return AdmissionPlan(self, _Placement.of(self), max_rows, tolerance)

    def _estimate_shapes(
        self, shapes: list[StepShape], max_rows: int, tolerance: float
    ) -> BatchEstimate:
        rows = sum(shape.rows for shape in shapes)
        row_limit = None
        if self.step_cost.fitted and rows:
            past = round(sum(s.rows * s.past_len for s in shapes) / rows)
            width = round(sum(s.rows * s.width for s in shapes) / rows)
            row_limit = self.step_cost.best_rows(past, width, max_rows, tolerance)
        return BatchEstimate(
            rows=rows,
            padded_tokens=sum(shape.rows * (shape.past_len + shape.width) for shape in shapes),
            row_limit=row_limit,
        )

    def _join_target(
        self,
        shortest: int,
        longest: int,
        rows: int,
        shapes: dict[int, StepShape] | None = None,
        spans: dict[int, tuple[int, int]] | None = None,
        groups: int | None = None,
    ) -> _Group | None:
        """The group ``rows`` newcomers with sources of ``shortest..longest`` tokens join, or
        None (they open a group of their own).

        With a fitted step-cost model: whichever adds least to the step's predicted time,
        another decoder call (its fixed overhead) or padding an existing group. Before that:
        a young group of similar lengths, else a group of their own."""
        if not self._groups:
            return None
        groups = len(self._groups) if groups is None else groups
        if self.step_cost.fitted:
            return self._cheapest_target(rows, longest, shapes, groups)

        def span(group: _Group) -> tuple[int, int]:
            return spans[id(group)] if spans is not None else (group.shortest, group.width)

        young = [group for group in self._groups if group.past_len <= self.merge_past]
        for group in young:
            low, high = span(group)
            if similar_lengths(min(low, shortest), max(high, longest), self.length_slack):
                return group
        if groups < self.max_groups:
            return None

        # No group fits and no room for another: the one that grows least in padded tokens.
        def added_padding(group: _Group) -> int:
            width = max(span(group)[1], longest)
            return group.rows * (width - group.width) + width - shortest + group.past_len

        return min(self._groups, key=added_padding)

    def _cheapest_target(
        self, rows: int, width: int, shapes: dict[int, StepShape] | None, groups: int
    ) -> _Group | None:
        predict = self.step_cost.predict
        best: _Group | None = None
        best_cost = predict(StepShape(rows, 0, width)) if groups < self.max_groups else None
        for group in self._groups:
            shape = shapes[id(group)] if shapes is not None else group.shape
            joined = StepShape(shape.rows + rows, shape.past_len, max(shape.width, width))
            cost = predict(joined) - predict(shape)
            if best_cost is None or cost < best_cost:
                best, best_cost = group, cost
        return best

    # --- batch operations ------------------------------------------------------------------

    def validate(self, request: DecodeRequest) -> str | None:
        """Why ``request`` cannot be decoded, or None."""
        info = self.model.info
        if not request.src_ids:
            return "empty source"
        if len(request.src_ids) > info.max_positions:
            return (
                f"{len(request.src_ids)} source tokens, the model has "
                f"{info.max_positions} positions"
            )
        if request.max_new_tokens < 1:
            return "max_new_tokens must be >= 1"
        if not 1 <= request.beam_size <= info.vocab_size // 2:
            return f"beam_size must be between 1 and {info.vocab_size // 2}"
        if any(not 0 <= token < info.vocab_size for token in request.src_ids):
            return f"source token ids must be in [0, {info.vocab_size})"
        return None

    def add(self, requests: list[DecodeRequest]) -> list[RejectedRequest]:
        """Encode the newcomers (one encoder call per length class) and place them in groups.
        Invalid requests are returned, rejected alone; the others are admitted."""
        encoded = self.encode(requests)
        self.place(encoded)
        return encoded.rejected

    def encode(self, requests: list[DecodeRequest]) -> EncodedRequests:
        """The first half of ``add``: validate and run the encoder, nothing joins the batch.

        It touches no batch state, so another thread may run it while the engine thread
        steps the running rows (the batcher's encoder overlap); ``place`` then adds the
        result to the batch between two steps."""
        rejected: list[RejectedRequest] = []
        valid: list[DecodeRequest] = []
        for request in requests:
            reason = self.validate(request)
            if reason is None:
                valid.append(request)
            else:
                rejected.append(RejectedRequest(request.request_id, reason))
        groups = [self._encode_class(length_class) for length_class in self._length_classes(valid)]
        return EncodedRequests(groups, rejected)

    def place(self, encoded: EncodedRequests) -> None:
        """The second half of ``add``: encoded newcomers join a group or open one."""
        for group in encoded.groups:
            target = self._join_target(group.shortest, group.width, group.rows)
            if target is None:
                self._groups.append(group)
            else:
                self._merge_into(target, group)

    def _length_classes(self, requests: list[DecodeRequest]) -> list[list[DecodeRequest]]:
        """Requests sorted by source length, cut where lengths stop being similar."""
        classes: list[list[DecodeRequest]] = []
        for request in sorted(requests, key=lambda request: len(request.src_ids)):
            length = len(request.src_ids)
            if classes and similar_lengths(len(classes[-1][0].src_ids), length, self.length_slack):
                classes[-1].append(request)
            else:
                classes.append([request])
        return classes

    def _encode_class(self, requests: list[DecodeRequest]) -> _Group:
        """One encoder call for requests of similar source length: a group of their own, with
        an empty self-attention cache (not in the batch yet)."""
        info = self.model.info
        src_len = max(len(request.src_ids) for request in requests)
        input_ids = np.full((len(requests), src_len), info.pad_id, dtype=np.int64)  # (M, S')
        attention_mask = np.zeros((len(requests), src_len), dtype=np.int64)
        for row, request in enumerate(requests):
            input_ids[row, : len(request.src_ids)] = request.src_ids
            attention_mask[row, : len(request.src_ids)] = 1
        cross = self.kv.encode(input_ids, attention_mask)  # 2L x (M, H, S', Dh)

        newcomers = [
            _Active(
                request=request,
                search=make_search(
                    request.beam_size,
                    # positions index a table of max_positions rows
                    min(request.max_new_tokens, info.max_positions),
                    info.eos_id,
                    info.pad_id,
                    request.length_penalty,
                    request.copy_tokens,
                    request.forced_prefix,
                ),
                src_len=len(request.src_ids),
                next_tokens=np.full(request.beam_size, info.decoder_start_id, dtype=np.int64),
            )
            for request in requests
        ]
        repeats = np.array([active.num_rows for active in newcomers])
        new_rows = int(repeats.sum())
        if new_rows != len(requests):  # beams share their sentence's cross K/V: repeat rows
            cross = self.kv.select(cross, np.repeat(np.arange(len(requests)), repeats), 0, src_len)
        return _Group(
            newcomers,
            _Batch(
                self_cache=self.kv.empty(new_rows),
                cross_cache=cross,
                self_mask=np.zeros((new_rows, 0), dtype=np.int64),
                encoder_mask=np.repeat(attention_mask, repeats, axis=0),  # (R, S')
            ),
        )

    def _merge_into(self, target: _Group, other: _Group) -> None:
        """``other``'s rows after ``target``'s, in ``target``: self caches left-padded to the
        longer past (invalid slots, masked), sources right-padded to the wider source."""
        a, b = target.batch, other.batch
        past_len = max(a.self_mask.shape[1], b.self_mask.shape[1])
        width = max(a.encoder_mask.shape[1], b.encoder_mask.shape[1])
        target.batch = _Batch(
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
        target.requests.extend(other.requests)
        target.rows += other.rows

    def step(self) -> list[FinishedRequest]:
        """One decoder step over all active rows; returns the requests that finished in it."""
        if not self._groups:
            return []
        finished: list[FinishedRequest] = []
        for group in self._groups:
            finished += self._step_group(group)
        self.steps += 1
        self._retire_empty_groups()
        if finished:
            self._merge_close_groups()
        return finished

    def _retire_empty_groups(self) -> None:
        """Groups whose requests all left go, their caches back to the backend for reuse."""
        for group in self._groups:
            if not group.requests:
                self.kv.release(group.batch.self_cache)
                self.kv.release(group.batch.cross_cache)
        self._groups = [group for group in self._groups if group.requests]

    def _merge_close_groups(self) -> None:
        """Groups whose past lengths came close (rows left, the caches were trimmed) and whose
        sources are of similar length become one: fewer decoder calls for little padding."""
        merged: list[_Group] = []
        for group in self._groups:
            partner = next((other for other in merged if self._worth_merging(other, group)), None)
            if partner is None:
                merged.append(group)
            else:
                self._merge_into(partner, group)
        self._groups = merged

    def _worth_merging(self, first: _Group, second: _Group) -> bool:
        """One decoder call for both costs less than two (by the step-cost model once it is
        fitted; before, when pasts and source lengths are close)."""
        if self.step_cost.fitted:
            a, b = first.shape, second.shape
            merged = StepShape(a.rows + b.rows, max(a.past_len, b.past_len), max(a.width, b.width))
            predict = self.step_cost.predict
            return predict(merged) <= predict(a) + predict(b)
        return abs(first.past_len - second.past_len) <= self.merge_past and similar_lengths(
            min(first.shortest, second.shortest), max(first.width, second.width), self.length_slack
        )

    def _step_inputs(self, group: _Group) -> StepInputs:
        info = self.model.info
        requests = group.requests
        rows = group.rows
        batch = group.batch
        static_bans = [info.pad_id] + ([info.unk_id] if self.ban_unk else [])
        extra_bans = [active.search.bans() for active in requests]
        watched = [active.search.watch_ids() for active in requests]
        ban_width = max((b.shape[1] for b in extra_bans if b is not None), default=0)
        banned = np.full((rows, len(static_bans) + ban_width), info.pad_id, dtype=np.int64)
        banned[:, : len(static_bans)] = static_bans
        # A search that watches ids also sees its row's bans: it can tell the argmax before
        # them (service/runtime/search.py).
        watched = [None if w is None else np.append(w, static_bans) for w in watched]
        watch_width = max((len(w) for w in watched if w is not None), default=1)
        watch = np.full((rows, watch_width), info.pad_id, dtype=np.int64)
        offset = 0
        for active, bans, ids in zip(requests, extra_bans, watched, strict=True):
            end = offset + active.num_rows
            if bans is not None:
                banned[offset:end, len(static_bans) : len(static_bans) + bans.shape[1]] = bans
            if ids is not None:
                watch[offset:end, : len(ids)] = ids
            offset = end
        return StepInputs(
            input_ids=np.concatenate([active.next_tokens for active in requests])[:, None],
            positions=np.concatenate(
                [np.full(active.num_rows, active.steps, dtype=np.int64) for active in requests]
            )[:, None],
            self_attention_mask=np.concatenate(
                [batch.self_mask, np.ones((rows, 1), dtype=np.int64)], axis=1
            ),  # (N, P+1)
            encoder_attention_mask=batch.encoder_mask,
            top_k=min(max(active.search.top_k for active in requests), info.vocab_size),
            banned_ids=banned,
            watch_ids=watch,
        )

    def _step_group(self, group: _Group) -> list[FinishedRequest]:
        batch = group.batch
        requests = group.requests
        shape = group.shape
        started = time.perf_counter()  # the whole group step is timed: host work is a cost too
        inputs = self._step_inputs(group)
        head, present = self.kv.decode(inputs, batch.self_cache, batch.cross_cache)
        batch.self_cache, batch.self_mask = present, inputs.self_attention_mask

        finished: list[FinishedRequest] = []
        remaining: list[_Active] = []
        cache_rows: list[np.ndarray] = []  # per remaining request: the rows its beams continue
        own_rows: list[np.ndarray] = []  # per remaining request: its rows, unpermuted
        offset = 0
        for active in requests:
            rows = active.num_rows
            next_tokens, parents = active.search.advance(head.rows(offset, offset + rows))
            active.steps += 1
            if active.search.done:
                finished.append(
                    FinishedRequest(
                        active.request.request_id,
                        active.search.result(),
                        active.steps,
                        active.search.hypotheses(),
                    )
                )
            else:
                active.next_tokens = next_tokens
                remaining.append(active)
                cache_rows.append(offset + parents)
                own_rows.append(offset + np.arange(rows))
            offset += rows
        group.requests = remaining
        group.rows = sum(active.num_rows for active in remaining)
        self._rearrange(group, cache_rows, own_rows, rows_left=len(finished) > 0)
        self.step_cost.observe(shape, time.perf_counter() - started)
        return finished

    def drop(self, request_ids: Iterable[Hashable]) -> None:
        """Cancelled requests leave the batch (unknown ids are ignored)."""
        dropped = set(request_ids)
        for group in self._groups:
            remaining, kept_rows = [], []
            offset = 0
            for active in group.requests:
                if active.request.request_id not in dropped:
                    remaining.append(active)
                    kept_rows.append(offset + np.arange(active.num_rows))
                offset += active.num_rows
            if len(remaining) == len(group.requests):
                continue
            group.requests = remaining
            group.rows = sum(active.num_rows for active in remaining)
            self._rearrange(group, kept_rows, kept_rows, rows_left=True)
        self._retire_empty_groups()

    def _rearrange(
        self,
        group: _Group,
        cache_rows: list[np.ndarray],
        own_rows: list[np.ndarray],
        rows_left: bool,
    ) -> None:
        """Gather the self-attention cache rows (beam reorder, retire) and trim columns; no
        copy at all when nothing moved (greedy rows, beams that kept their order)."""
        batch = group.batch
        if not group.requests:
            return
        num_rows, past_len = batch.self_mask.shape
        rows = np.concatenate(cache_rows)
        start = 0
        if rows_left:
            # Left cache slots invalid for every remaining row (only rows that left used them)
            # are dropped. Only rows leaving can create such slots: a request's beams share
            # one mask (reordering them changes nothing), and newcomers' invalid slots lie
            # under the valid ones of the rows they joined.
            start = int(batch.self_mask[rows].any(axis=0).argmax())
        if start > 0 or len(rows) != num_rows or not (rows == np.arange(num_rows)).all():
            batch.self_cache = self.kv.select(batch.self_cache, rows, start, past_len)
            batch.self_mask = batch.self_mask[rows, start:]
        if rows_left:
            # A request's beams share identical cross K/V: its own rows, unpermuted, suffice.
            cross_rows = np.concatenate(own_rows)
            end = max(active.src_len for active in group.requests)
            batch.cross_cache = self.kv.select(batch.cross_cache, cross_rows, 0, end)
            batch.encoder_mask = batch.encoder_mask[cross_rows, :end]

    # --- conveniences ----------------------------------------------------------------------

    def translate_ids(
        self,
        src_ids: list[list[int]],
        beam_size: int = 1,
        max_new_tokens: int = 128,
        length_penalty: float = 1.0,
        copy_tokens: list[dict[int, int] | None] | None = None,
    ) -> list[list[int]]:
        """Offline: add all sentences, step until they finish; results in input order.

        ``copy_tokens``: per sentence, the placeholder constraint (see ``DecodeRequest``).

        For an engine nobody else drives (scripts, warm-up, tests): results of other requests
        that finish meanwhile are not returned to anyone."""
        ids = [("translate_ids", self.steps, index) for index in range(len(src_ids))]
        constraints = copy_tokens if copy_tokens is not None else [None] * len(src_ids)
        rejected = self.add(
            [
                DecodeRequest(
                    request_id, list(src), beam_size, max_new_tokens, length_penalty, copies
                )
                for request_id, src, copies in zip(ids, src_ids, constraints, strict=True)
            ]
        )
        if rejected:
            self.drop(ids)
            raise ValueError(f"request {rejected[0].request_id!r}: {rejected[0].reason}")
        results: dict[Hashable, list[int]] = {}
        pending = set(ids)
        while pending:
            for done in self.step():
                if done.request_id in pending:
                    results[done.request_id] = done.tokens
                    pending.discard(done.request_id)
        return [results[request_id] for request_id in ids]

    def warmup(self) -> float:
        """Run a tiny greedy and beam translation (allocations, kernel selection); returns seconds."""
        started = time.perf_counter()
        src = self._warmup_source(4)
        self.translate_ids([src], beam_size=1, max_new_tokens=4)
        self.translate_ids([src, src[1:]], beam_size=2, max_new_tokens=4)
        elapsed = time.perf_counter() - started
        log.info("engine warmed up in %.2f s on %s", elapsed, self.provider)
        return elapsed

    def _warmup_source(self, length: int) -> list[int]:
        info = self.model.info
        special = {info.pad_id, info.eos_id, info.decoder_start_id, info.unk_id}
        ordinary = [token for token in range(1, info.vocab_size) if token not in special]
        return [ordinary[i % len(ordinary)] for i in range(length - 1)] + [info.eos_id]

    def calibrate(
        self,
        rows: Iterable[int] = (1, 4, 8, 16, 32, 64),
        widths: Iterable[int] = (8, 32),
        past_lens: Iterable[int] = (0, 16),
        repeats: int = 2,
    ) -> float:
        """Time decoder calls over a spread of shapes (random caches, nothing joins the batch)
        and fit ``step_cost`` to them; returns seconds spent. Called once at start-up, so the
        batcher knows where this machine's knee lies before traffic arrives."""
        info = self.model.info
        started = time.perf_counter()
        samples: list[tuple[StepShape, float]] = []
        rng = np.random.default_rng(0)
        for width in widths:
            src = np.array(self._warmup_source(width))
            for count in rows:
                input_ids = np.tile(src, (count, 1))
                mask = np.ones_like(input_ids)
                cross = self.kv.encode(input_ids, mask)
                for past_len in past_lens:
                    past = self.kv.empty(count)
                    tokens = np.full((count, 1), info.decoder_start_id, dtype=np.int64)
                    # grow the cache to past_len with real decoder calls (untimed)
                    for position in range(past_len + repeats):
                        # two ban columns, as the engine's pad and unk
                        inputs = StepInputs.lockstep(
                            tokens, position, mask, top_k=8, pad_id=info.pad_id, bans=2
                        )
                        tick = time.perf_counter()
                        head, past = self.kv.decode(inputs, past, cross)
                        if position >= past_len:
                            shape = StepShape(count, position, width)
                            samples.append((shape, time.perf_counter() - tick))
                        tokens = rng.choice(head.top_ids[:, :4].reshape(-1), (count, 1))
        self.step_cost.calibrate(samples)
        elapsed = time.perf_counter() - started
        log.info(
            "step cost calibrated in %.2f s over %d decoder calls: %s",
            elapsed,
            len(samples),
            [round(c, 6) for c in self.step_cost.coefficients],
        )
        return elapsed


class _Placement:
    """Where newcomers would go, without moving anything: the shape and source span of each
    group once newcomers ``(rows, src_len)`` are placed as ``Engine.add`` would place them,
    and the groups they would open."""

    def __init__(
        self,
        engine: Engine,
        shapes: dict[int, StepShape],
        spans: dict[int, tuple[int, int]],
        extra: list[list[int]],
    ) -> None:
        self.engine = engine
        self.shapes_by_group = shapes
        self.spans = spans
        self.extra = extra  # [rows, shortest, width] of the groups newcomers would open

    @classmethod
    def of(cls, engine: Engine) -> _Placement:
        groups = engine._groups
        return cls(
            engine,
            {id(group): group.shape for group in groups},
            {id(group): (group.shortest, group.width) for group in groups},
            [],
        )

    def copy(self) -> _Placement:
        return _Placement(
            self.engine,
            dict(self.shapes_by_group),
            dict(self.spans),
            [list(group) for group in self.extra],
        )

    def place(self, rows: int, src_len: int) -> None:
        engine = self.engine
        groups = len(engine._groups) + len(self.extra)
        target = engine._join_target(
            src_len, src_len, rows, self.shapes_by_group, self.spans, groups
        )
        if target is not None:
            shape = self.shapes_by_group[id(target)]
            shortest, width = self.spans[id(target)]
            self.spans[id(target)] = (min(shortest, src_len), max(width, src_len))
            self.shapes_by_group[id(target)] = StepShape(
                shape.rows + rows, shape.past_len, max(shape.width, src_len)
            )
            return
        for group in self.extra:
            if similar_lengths(min(group[1], src_len), max(group[2], src_len), engine.length_slack):
                group[0] += rows
                group[1], group[2] = min(group[1], src_len), max(group[2], src_len)
                return
        self.extra.append([rows, src_len, src_len])

    def shapes(self) -> list[StepShape]:
        return list(self.shapes_by_group.values()) + [
            StepShape(rows, 0, width) for rows, _, width in self.extra
        ]


class AdmissionPlan:
    """The running batch as the batcher fills it at one step (``Engine.plan``)."""

    def __init__(
        self, engine: Engine, placement: _Placement, max_rows: int, tolerance: float
    ) -> None:
        self._engine = engine
        self._placement = placement
        self._max_rows = max_rows
        self._tolerance = tolerance

    def estimate(self, newcomers: Sequence[tuple[int, int]]) -> BatchEstimate:
        """The batch with what was taken so far and ``newcomers`` too."""
        trial = self._placement.copy()
        for rows, src_len in newcomers:
            trial.place(rows, src_len)
        return self._engine._estimate_shapes(trial.shapes(), self._max_rows, self._tolerance)

    def take(self, newcomers: Sequence[tuple[int, int]]) -> None:
        for rows, src_len in newcomers:
            self._placement.place(rows, src_len)


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


__all__ = [
    "AdmissionPlan",
    "DecodeRequest",
    "EncodedRequests",
    "Engine",
    "FinishedRequest",
    "RejectedRequest",
    "StepOutput",
]
