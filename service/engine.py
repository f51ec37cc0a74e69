"""The running batch that the continuous batcher drives: add requests, step, retire, drop.

Rows: every request occupies ``search.num_rows`` contiguous rows (1 greedy, K beams), in the
order the requests joined. Batched state lives in one place (``_Batch``): the self-attention
cache (N, H, P, Dh) and cross K/V (N, H, S, Dh) as device OrtValues, and two small host masks.
Per-request state lives in one small object per request (``_Active``).

Rows join a running batch late: their self-attention cache slots to the left of their first
token are invalid (zeros, masked out by ``self_attention_mask``); their source is zero-padded
on the right to the batch's S (masked by ``encoder_attention_mask``). Each row feeds its own
position (the number of tokens it has generated), so a translation does not depend on its
batch. After every step finished requests leave at once, and columns no remaining row needs
are trimmed (left cache slots that are invalid for every row, source padding beyond the
longest remaining source).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.decoding import BeamSearch, GreedySearch, make_search
from service.onnx_model import Cache, OnnxSeq2Seq, ProviderName

log = logging.getLogger(__name__)


@dataclass
class DecodeRequest:
    request_id: Hashable
    src_ids: list[int]  # already tokenized, ends with eos
    beam_size: int = 1
    max_new_tokens: int = 128
    length_penalty: float = 1.0
    # Placeholder constraint (service/decoding.py, CopyConstraint): every placeholder-symbol
    # id of the vocabulary -> how often the source has it (0: never emit it). None: none.
    copy_tokens: dict[int, int] | None = None


@dataclass
class FinishedRequest:
    request_id: Hashable
    tokens: list[int]  # generated ids, no start token, no eos
    steps: int  # decoder steps this request took part in


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

    self_cache: Cache  # 2L x (N, H, P, Dh) on the device
    cross_cache: Cache  # 2L x (N, H, S, Dh) on the device
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


@dataclass
class Engine:
    model: OnnxSeq2Seq
    model_dir: Path
    model_name: str = ""
    steps: int = 0
    # Cohorts: rows that joined at about the same time share one dense batch (one decoder
    # call per group and step), so a newcomer is not padded to the past length of a row that
    # has decoded for a hundred steps. Newcomers join the youngest group while its past is at
    # most ``merge_past`` (or ``max_groups`` groups exist), else they open a group; groups
    # whose past lengths come within ``merge_past`` of each other merge. 1 = one batch.
    max_groups: int = 3
    merge_past: int = 8
    _groups: list[_Group] = field(default_factory=list)
    _tokenizer: Any = None

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        provider: ProviderName = "auto",
        intra_op_threads: int = 0,
        host_kv: bool | None = None,
    ) -> Engine:
        """``host_kv``: see ``OnnxSeq2Seq`` (default: numpy caches exactly on CPU)."""
        model = OnnxSeq2Seq(
            model_dir, provider=provider, intra_op_threads=intra_op_threads, host_kv=host_kv
        )
        return cls(model=model, model_dir=Path(model_dir), model_name=model.info.model_name)

    # --- read-only properties --------------------------------------------------------------

    @property
    def provider(self) -> str:
        """The provider actually in use ("cuda" or "cpu")."""
        return self.model.provider

    @property
    def tokenizer(self) -> Any:
        """``service.tokenizer.Tokenizer`` of the export dir, loaded on first use (exports of
        test models carry no tokenizer files)."""
        if self._tokenizer is None:
            from service.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_dir(self.model_dir)
        return self._tokenizer

    @property
    def _requests(self) -> list[_Active]:
        return [active for group in self._groups for active in group.requests]

    @property
    def _batch(self) -> _Batch | None:
        """The youngest group's tensors (the only group's, when there is one)."""
        return self._groups[-1].batch if self._groups else None

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
    def past_len(self) -> int:
        """P that newcomers would be padded to now: the youngest group's past length if they
        would join it, else 0 (they would open a group of their own)."""
        target = self._join_target()
        return 0 if target is None else target.past_len

    def _grouping(self) -> bool:
        # Merging groups of different past lengths left-pads a cache: host arrays only.
        return self.model.host_kv and self.max_groups > 1

    def _join_target(self) -> _Group | None:
        if not self._groups:
            return None
        youngest = self._groups[-1]
        if (
            not self._grouping()
            or youngest.past_len <= self.merge_past
            or len(self._groups) >= self.max_groups
        ):
            return youngest
        return None

    # --- batch operations ------------------------------------------------------------------

    def add(self, requests: list[DecodeRequest]) -> None:
        """Encode the newcomers in one encoder call and merge them into the running batch."""
        if not requests:
            return
        info = self.model.info
        for request in requests:
            if not request.src_ids:
                raise ValueError(f"request {request.request_id!r}: empty source")
            if len(request.src_ids) > info.max_positions:
                raise ValueError(
                    f"request {request.request_id!r}: {len(request.src_ids)} source tokens, "
                    f"the model has {info.max_positions} positions"
                )
            if request.max_new_tokens < 1:
                raise ValueError(f"request {request.request_id!r}: max_new_tokens must be >= 1")
        src_len = max(len(request.src_ids) for request in requests)
        input_ids = np.full((len(requests), src_len), info.pad_id, dtype=np.int64)  # (M, S')
        attention_mask = np.zeros((len(requests), src_len), dtype=np.int64)
        for row, request in enumerate(requests):
            input_ids[row, : len(request.src_ids)] = request.src_ids
            attention_mask[row, : len(request.src_ids)] = 1
        cross = self.model.encode(input_ids, attention_mask)  # 2L x (M, H, S', Dh)

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
                ),
                src_len=len(request.src_ids),
                next_tokens=np.full(request.beam_size, info.decoder_start_id, dtype=np.int64),
            )
            for request in requests
        ]
        repeats = np.array([active.num_rows for active in newcomers])
        new_rows = int(repeats.sum())
        if new_rows != len(requests):  # beams share their sentence's cross K/V: repeat rows
            cross = self.model.select(
                cross, np.repeat(np.arange(len(requests)), repeats), 0, src_len
            )
        encoder_mask = np.repeat(attention_mask, repeats, axis=0)  # (R, S')
        group = _Group(
            newcomers,
            _Batch(
                self_cache=self.model.empty_cache(new_rows),
                cross_cache=cross,
                self_mask=np.zeros((new_rows, 0), dtype=np.int64),
                encoder_mask=encoder_mask,
            ),
        )
        target = self._join_target()
        if target is None:
            self._groups.append(group)
        else:
            self._merge_into(target, group)

    def _merge_into(self, target: _Group, other: _Group) -> None:
        """``other``'s rows after ``target``'s, in ``target``: self caches left-padded to the
        longer past (invalid slots, masked), sources right-padded to the wider source."""
        a, b = target.batch, other.batch
        past_len = max(a.self_mask.shape[1], b.self_mask.shape[1])
        width = max(a.encoder_mask.shape[1], b.encoder_mask.shape[1])
        if self.model.host_kv:
            # One copy of both into arrays sized for everyone, padding only zero-filled.
            self_cache = [
                _host_merge(x, y, past_len, left=True)
                for x, y in zip(a.self_cache, b.self_cache, strict=True)
            ]
            cross_cache = [
                _host_merge(x, y, width, left=False)
                for x, y in zip(a.cross_cache, b.cross_cache, strict=True)
            ]
        else:  # only newcomers (past 0) join a group here: no left padding needed
            assert b.self_mask.shape[1] == 0
            self_cache = self.model.concat(a.self_cache, b.self_cache)
            cross_cache = self.model.concat(a.cross_cache, b.cross_cache)
        target.batch = _Batch(
            self_cache=self_cache,
            cross_cache=cross_cache,
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
        self._groups = [group for group in self._groups if group.requests]
        if finished:
            self._merge_close_groups()
        return finished

    def _merge_close_groups(self) -> None:
        """Neighbouring groups whose past lengths came close (rows left, the caches were
        trimmed) become one: fewer decoder calls for little padding."""
        merged = self._groups[:1]
        for group in self._groups[1:]:
            last = merged[-1]
            if abs(last.past_len - group.past_len) <= self.merge_past:
                self._merge_into(last, group)
            else:
                merged.append(group)
        self._groups = merged

    def _step_group(self, group: _Group) -> list[FinishedRequest]:
        batch = group.batch
        requests = group.requests
        input_ids = np.concatenate([active.next_tokens for active in requests])[:, None]  # (N, 1)
        positions = np.concatenate(
            [np.full(active.num_rows, active.steps, dtype=np.int64) for active in requests]
        )[:, None]  # (N, 1)
        self_mask = np.concatenate(
            [batch.self_mask, np.ones((len(input_ids), 1), dtype=np.int64)], axis=1
        )  # (N, P+1)
        logits, present = self.model.decode(
            input_ids, positions, self_mask, batch.self_cache, batch.cross_cache, batch.encoder_mask
        )  # (N, 1, V), 2L x (N, H, P+1, Dh)
        batch.self_cache, batch.self_mask = present, self_mask

        finished: list[FinishedRequest] = []
        remaining: list[_Active] = []
        cache_rows: list[np.ndarray] = []  # per remaining request: the rows its beams continue
        own_rows: list[np.ndarray] = []  # per remaining request: its rows, unpermuted
        offset = 0
        for active in requests:
            rows = active.num_rows
            next_tokens, parents = active.search.advance(logits[offset : offset + rows, -1])
            active.steps += 1
            if active.search.done:
                finished.append(
                    FinishedRequest(active.request.request_id, active.search.result(), active.steps)
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
        self._groups = [group for group in self._groups if group.requests]

    def _rearrange(
        self,
        group: _Group,
        cache_rows: list[np.ndarray],
        own_rows: list[np.ndarray],
        rows_left: bool,
    ) -> None:
        """Gather the self-attention cache rows (beam reorder, retire) and trim columns."""
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
            batch.self_cache = self.model.select(batch.self_cache, rows, start, past_len)
            batch.self_mask = batch.self_mask[rows, start:]
        if rows_left:
            # A request's beams share identical cross K/V: its own rows, unpermuted, suffice.
            cross_rows = np.concatenate(own_rows)
            end = max(active.src_len for active in group.requests)
            batch.cross_cache = self.model.select(batch.cross_cache, cross_rows, 0, end)
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
        self.add(
            [
                DecodeRequest(
                    request_id, list(src), beam_size, max_new_tokens, length_penalty, copies
                )
                for request_id, src, copies in zip(ids, src_ids, constraints, strict=True)
            ]
        )
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
        info = self.model.info
        special = {info.pad_id, info.eos_id, info.decoder_start_id}
        src = [token for token in range(1, info.vocab_size) if token not in special][:4] + [
            info.eos_id
        ]
        started = time.perf_counter()
        self.translate_ids([src], beam_size=1, max_new_tokens=4)
        self.translate_ids([src, src[1:]], beam_size=2, max_new_tokens=4)
        elapsed = time.perf_counter() - started
        log.info("engine warmed up in %.2f s on %s", elapsed, self.provider)
        return elapsed


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


def _host_merge(a: np.ndarray, b: np.ndarray, length: int, left: bool) -> np.ndarray:
    """Host caches (Na, H, La, Dh), (Nb, H, Lb, Dh) -> (Na+Nb, H, length, Dh): rows of ``a``
    then ``b``, each zero-padded on axis 2 (on the left or the right); one pass over the data."""
    n = a.shape[0]
    out = np.empty((n + b.shape[0], a.shape[1], length, a.shape[3]), dtype=a.dtype)
    for part, rows in ((a, slice(0, n)), (b, slice(n, None))):
        pad = length - part.shape[2]
        if left:
            out[rows, :, pad:] = part
            if pad:
                out[rows, :, :pad] = 0
        else:
            out[rows, :, : part.shape[2]] = part
            if pad:
                out[rows, :, part.shape[2] :] = 0
    return out
