"""The running batch that the continuous batcher drives: encode, place, step, retire, drop.

The batch is a few groups (service/runtime/groups.py): rows that joined at about the same time
and have sources of about the same length share one dense batch, one decoder call per group
and step. Where newcomers go and which groups merge is decided by ``PlacementRules``
(service/runtime/placement.py); the tensors move inside ``Group``. Batched state lives wherever
the model's KV backend keeps it (service/runtime/onnx_model.py: numpy on the host, OrtValues on
the device); the engine only calls the backend's operations.

Three cost models learn from the engine's own calls (service/runtime/step_cost.py): every
decoder step (timed whole, host work included), every encoder call, and every placement
(merging newcomers' caches into a group). The batcher asks ``estimate`` or ``plan`` what a batch
with some newcomers would cost before it admits them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from service.runtime import calibration
from service.runtime.buffer_pool import DEFAULT_MAX_FREE_BYTES
from service.runtime.groups import (
    DecodeRequest,
    FinishedRequest,
    Group,
    GroupSpan,
    GroupTensors,
    encode_calls,
)
from service.runtime.onnx_model import KVBackend, KVBackendName, OnnxSeq2Seq, ProviderName
from service.runtime.placement import (
    Placement,
    PlacementRules,
    encoder_calls,
    length_classes,
)
from service.runtime.step_cost import (
    CallCostModel,
    EncodePrices,
    StepCostModel,
    StepShape,
    calls_features,
    merge_features,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchEstimate:
    """The running batch as ``Engine.estimate`` foresees it (for the batcher's admission)."""

    rows: int
    padded_tokens: int  # sum over groups of rows x (past + padded source)
    row_limit: int | None = None  # rows past which tokens/s fall (step-cost model), or None
    step_s: float = 0.0  # predicted seconds of the next step (0 before the model is fitted)
    encode_s: float = 0.0  # predicted seconds of the newcomers' encoder calls
    place_s: float = 0.0  # predicted seconds of merging them into the groups they join


@dataclass
class EncodedRequests:
    """``Engine.encode``'s result, for ``Engine.place``: encoded newcomers, one group per
    length class, and the requests refused."""

    groups: list[Group]
    rejected: list[RejectedRequest]

    @property
    def request_ids(self) -> list[Hashable]:
        return [active.request.request_id for group in self.groups for active in group.requests]


@dataclass(frozen=True)
class RejectedRequest:
    """A request ``Engine.add`` refused; the others admitted with it proceed."""

    request_id: Hashable
    reason: str


class EngineOptions(Protocol):
    """How an engine opens its export: the model settings (service/translation/
    model_settings.py) are such an object, read as they are."""

    @property
    def provider(self) -> ProviderName: ...
    @property
    def engine_threads(self) -> int: ...  # ONNX Runtime intra-op threads, already resolved
    @property
    def kv_pool_bytes(self) -> int: ...
    @property
    def vocab_screen(self) -> bool: ...


@dataclass
class Engine:
    model: OnnxSeq2Seq
    model_dir: Path
    model_name: str = ""
    steps: int = 0
    decoder_seconds: float = 0.0  # inside decoder calls so far (the batcher's timeline)
    # Placement (service/runtime/placement.py): at most ``max_groups`` groups; newcomers join
    # a group of past at most ``merge_past`` and similar source lengths (``length_slack``).
    max_groups: int = 4
    merge_past: int = 8
    length_slack: int = 8
    # Never generate the unknown token: it cannot be turned back into the text it replaced.
    ban_unk: bool = True
    step_cost: StepCostModel = field(default_factory=StepCostModel)
    encode_cost: CallCostModel = field(default_factory=lambda: CallCostModel(features=3))
    place_cost: CallCostModel = field(default_factory=lambda: CallCostModel(features=2))
    _groups: list[Group] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rules = PlacementRules(
            self.step_cost, self.max_groups, self.merge_past, self.length_slack
        )

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
    def from_options(cls, model_dir: str | Path, options: EngineOptions) -> Engine:
        return cls.from_dir(
            model_dir,
            provider=options.provider,
            intra_op_threads=options.engine_threads,
            kv_pool_bytes=options.kv_pool_bytes,
            vocab_screen=options.vocab_screen,
        )

    # --- read-only properties --------------------------------------------------------------

    @property
    def provider(self) -> str:
        """The provider actually in use ("cuda" or "cpu")."""
        return self.model.provider

    @property
    def kv(self) -> KVBackend:
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
    def group_tensors(self) -> list[GroupTensors]:
        """Each group's tensors, for tests and tools that inspect the caches."""
        return [group.tensors for group in self._groups]

    @property
    def step_shapes(self) -> list[StepShape]:
        """One decoder call per group at the next step."""
        return [group.shape for group in self._groups]

    # --- admission estimates ---------------------------------------------------------------

    def estimate(
        self, newcomers: Sequence[tuple[int, int]] = (), max_rows: int = 64, tolerance: float = 0.0
    ) -> BatchEstimate:
        """The batch once newcomers ``(rows, src_len)`` have joined (none: as it is).

        ``row_limit``: by the step-cost model, the most rows a batch of this mean past and
        source length should hold: the largest count (up to ``max_rows``) whose tokens/s stay
        within ``tolerance`` of the best count's (None before the model is fitted)."""
        plan = self.plan(max_rows, tolerance)
        return plan.estimate(newcomers)

    def plan(self, max_rows: int = 64, tolerance: float = 0.0) -> AdmissionPlan:
        """An admission plan over the batch as it is now: the batcher tries units of
        newcomers one after another and takes some; each try costs O(groups), however many
        were taken before, so admission between two steps stays linear in the queue."""
        return AdmissionPlan(self, Placement(self.rules, self.spans()), max_rows, tolerance)

    def spans(self) -> list[GroupSpan]:
        """What placement sees of each running group."""
        return [group.span for group in self._groups]

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
        """Encode the newcomers (the encoder calls of each length class) and place them in groups.
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
        started = time.perf_counter()
        joins = copied = 0
        for group in encoded.groups:
            spans = self.spans()
            target = self.rules.join_target(
                spans, group.shortest, group.width, group.rows, len(spans)
            )
            if target is None:
                self._groups.append(group)
            else:
                joined = self._groups[target]
                joins += 1
                copied += (joined.rows + group.rows) * (
                    max(joined.past_len, group.past_len) + max(joined.width, group.width)
                )
                joined.absorb(group)
        if joins:
            self.place_cost.observe(merge_features(joins, copied), time.perf_counter() - started)

    def _length_classes(self, requests: list[DecodeRequest]) -> list[list[DecodeRequest]]:
        """Requests sorted by source length, cut where lengths stop being similar."""
        return length_classes(requests, _source_length, self.length_slack)

    def _encode_class(self, requests: list[DecodeRequest]) -> Group:
        """Requests of similar source length as one group, encoded in the calls that cost
        least (timed whole for the cost model: the calls and the copy that joins them)."""
        started = time.perf_counter()
        calls = encoder_calls(requests, _source_length, EncodePrices.of(self.encode_cost))
        group = encode_calls(self.kv, self.model.info, calls)
        self.encode_cost.observe(
            calls_features([[_source_length(r) for r in call] for call in calls]),
            time.perf_counter() - started,
        )
        return group

    def step(self) -> list[FinishedRequest]:
        """One decoder step over all active rows; returns the requests that finished in it."""
        if not self._groups:
            return []
        info = self.model.info
        static_bans = [info.pad_id] + ([info.unk_id] if self.ban_unk else [])
        finished: list[FinishedRequest] = []
        for group in self._groups:
            shape = group.shape
            started = time.perf_counter()  # timed whole: host work is a cost too
            finished += group.step(info, static_bans)
            self.step_cost.observe(shape, time.perf_counter() - started)
            self.decoder_seconds += group.last_decode_s
        self.steps += 1
        self._retire_empty_groups()
        if finished:
            self._merge_close_groups()
        return finished

    def _retire_empty_groups(self) -> None:
        """Groups whose requests all left go, their caches back to the backend for reuse."""
        for group in self._groups:
            if not group.requests:
                group.release()
        self._groups = [group for group in self._groups if group.requests]

    def _merge_close_groups(self) -> None:
        """Groups whose past lengths came close (rows left, the caches were trimmed) and whose
        sources are of similar length become one: fewer decoder calls for little padding."""
        merged: list[Group] = []
        for group in self._groups:
            partner = next(
                (other for other in merged if self.rules.worth_merging(other.span, group.span)),
                None,
            )
            if partner is None:
                merged.append(group)
            else:
                partner.absorb(group)
        self._groups = merged

    def drop(self, request_ids: Iterable[Hashable]) -> None:
        """Cancelled requests leave the batch (unknown ids are ignored)."""
        dropped = set(request_ids)
        for group in self._groups:
            group.drop(dropped)
        self._retire_empty_groups()

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
        """Run a tiny greedy and beam translation (allocations, kernel selection); returns
        seconds."""
        started = time.perf_counter()
        src = calibration.ordinary_source(self.model.info, 4)
        self.translate_ids([src], beam_size=1, max_new_tokens=4)
        self.translate_ids([src, src[1:]], beam_size=2, max_new_tokens=4)
        elapsed = time.perf_counter() - started
        log.info("engine warmed up in %.2f s on %s", elapsed, self.provider)
        return elapsed

    def calibrate(self, **spread: Any) -> float:
        """Fit the step and encoder cost models to calls timed over a spread of shapes
        (service/runtime/calibration.py); returns seconds spent."""
        return calibration.calibrate(self.model, self.step_cost, self.encode_cost, **spread)


class AdmissionPlan:
    """The running batch as the batcher fills it at one step (``Engine.plan``)."""

    def __init__(
        self, engine: Engine, placement: Placement, max_rows: int, tolerance: float
    ) -> None:
        self._engine = engine
        self._placement = placement
        self._max_rows = max_rows
        self._tolerance = tolerance
        self._taken: list[tuple[int, int]] = []
        self._before = list(placement.spans)  # the running groups before any newcomer
        self._encode_prices = EncodePrices.of(engine.encode_cost)
        self._cuts: dict[tuple[int, ...], list[list[int]]] = {}
        # The last estimate's newcomers and placement: taking just those adopts it.
        self._trial: tuple[list[tuple[int, int]], Placement] | None = None

    def estimate(self, newcomers: Sequence[tuple[int, int]]) -> BatchEstimate:
        """The batch with what was taken so far and ``newcomers`` too."""
        trial = self._placement.copy()
        for rows, src_len in newcomers:
            trial.place(rows, src_len)
        self._trial = (list(newcomers), trial)
        return self._estimate(trial, [*self._taken, *newcomers])

    def take(self, newcomers: Sequence[tuple[int, int]]) -> None:
        if self._trial is not None and self._trial[0] == list(newcomers):
            self._placement = self._trial[1]  # placed already, by the estimate just made
        else:
            for rows, src_len in newcomers:
                self._placement.place(rows, src_len)
        self._trial = None
        self._taken.extend(newcomers)

    def _estimate(self, placement: Placement, newcomers: list[tuple[int, int]]) -> BatchEstimate:
        engine = self._engine
        shapes = placement.shapes()
        rows = sum(shape.rows for shape in shapes)
        row_limit = None
        step_cost = engine.step_cost
        if step_cost.fitted and rows:
            past = round(sum(s.rows * s.past_len for s in shapes) / rows)
            width = round(sum(s.rows * s.width for s in shapes) / rows)
            row_limit = step_cost.best_rows(past, width, self._max_rows, self._tolerance)
        return BatchEstimate(
            rows=rows,
            padded_tokens=sum(shape.rows * (shape.past_len + shape.width) for shape in shapes),
            row_limit=row_limit,
            step_s=step_cost.step_seconds(shapes),
            encode_s=self._encode_seconds(newcomers),
            place_s=self._place_seconds(placement),
        )

    def _encode_seconds(self, newcomers: list[tuple[int, int]]) -> float:
        """Encoder calls as ``Engine.encode`` makes them: each length class cut by
        ``encoder_calls``, every call over its sentences padded to its longest source, the
        features the cost model was fitted on (beams share their sentence's call)."""
        if not newcomers:
            return 0.0
        sources = [length for _, length in newcomers]
        calls = [
            call
            for length_class in length_classes(sources, _itself, self._engine.length_slack)
            for call in self._encoder_calls(tuple(length_class))
        ]
        return self._engine.encode_cost.predict(calls_features(calls))

    def _encoder_calls(self, length_class: tuple[int, ...]) -> list[list[int]]:
        """``encoder_calls`` of a class, cut once per plan: the estimates of one choice share
        all classes but the one a candidate joins."""
        calls = self._cuts.get(length_class)
        if calls is None:
            calls = encoder_calls(list(length_class), _itself, self._encode_prices)
            self._cuts[length_class] = calls
        return calls

    def _place_seconds(self, placement: Placement) -> float:
        """Merging the newcomers into the running groups they join (groups they open cost
        no copy)."""
        joins = copied = 0
        for before, after in zip(self._before, placement.spans, strict=True):
            if after.shape.rows != before.shape.rows:
                joins += 1
                copied += after.shape.rows * (after.shape.past_len + after.shape.width)
        if not joins:
            return 0.0
        return self._engine.place_cost.predict(merge_features(joins, copied))


def _source_length(request: DecodeRequest) -> int:
    return len(request.src_ids)


def _itself(length: int) -> int:
    return length


__all__ = [
    "AdmissionPlan",
    "BatchEstimate",
    "DecodeRequest",
    "EncodedRequests",
    "Engine",
    "EngineOptions",
    "FinishedRequest",
    "RejectedRequest",
]
