"""The running batch that the continuous batcher drives: encode, place, step, retire, drop.

The batch is a few groups (service/runtime/groups.py): rows that joined at about the same time
and have sources of about the same length share one dense batch, one decoder call per group
and step. Where newcomers go and which groups merge is decided by ``PlacementRules``
(service/runtime/placement.py); the tensors move inside ``Group``. Batched state lives wherever
the model's KV backend keeps it (service/runtime/kv_cache.py: numpy on the host, OrtValues on
the device); the engine only calls the backend's operations.

Three cost models learn from the engine's own calls (service/runtime/step_cost.py): every
decoder step (timed whole, host work included), every encoder call, and every placement
(merging newcomers' caches into a group). The batcher asks ``estimate`` or ``plan`` what a batch
with some newcomers would cost before it admits them.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from service.runtime import calibration, offline
from service.runtime.encoding import encode_requests
from service.runtime.groups import EncodedRequests, Group, GroupSpan, GroupTensors
from service.runtime.kv_cache import KVBackend
from service.runtime.onnx_model import OnnxSeq2Seq, ProviderName, runs_on_cpu
from service.runtime.placement import (
    BatchPlan,
    Placement,
    PlacementRules,
)
from service.runtime.step_cost import (
    AdmissionPricing,
    CallCostModel,
    EncodePrices,
    StepCostModel,
    StepShape,
    merge_features,
)
from service.runtime.types import BatchEstimate, DecodeRequest, FinishedRequest, RejectedRequest
from service.runtime.variants import int8_variant, served_variant


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
    @property
    def cpu_int8(self) -> bool: ...  # the export's int8 variant on the CPU where it holds


# ``OnnxSeq2Seq``'s options that ``Engine.from_dir`` passes on.
OPENING = ("provider", "intra_op_threads", "kv_backend", "kv_pool_bytes", "vocab_screen")


def open_engine(model_dir: str | Path, options: EngineOptions) -> Engine:
    """The engine of one export, opened as the model settings say: on the CPU with
    ``cpu_int8``, the int8 variant the export carries where its recorded check holds
    (service/runtime/variants.py)."""
    cpu_int8 = getattr(options, "cpu_int8", False)
    if cpu_int8 and int8_variant(Path(model_dir)) is not None:  # else no provider probe
        model_dir = served_variant(model_dir, runs_on_cpu(model_dir, options.provider), True)
    return Engine.from_dir(
        model_dir,
        provider=options.provider,
        intra_op_threads=options.engine_threads,
        kv_pool_bytes=options.kv_pool_bytes,
        vocab_screen=options.vocab_screen,
    )


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
    def from_dir(cls, model_dir: str | Path, **options: Any) -> Engine:
        """``options``: how the export opens (``OPENING``, see ``OnnxSeq2Seq``; by default
        host caches exactly on CPU and the export's int8 screen of greedy steps) and the
        dataclass's scheduling fields (max_groups, merge_past, ...)."""
        opening = {name: options.pop(name) for name in OPENING if name in options}
        model = OnnxSeq2Seq(model_dir, **opening)
        name = model.info.model_name
        return cls(model=model, model_dir=Path(model_dir), model_name=name, **options)

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

    def plan(self, max_rows: int = 64, tolerance: float = 0.0) -> BatchPlan:
        """An admission plan over the batch as it is now: the batcher tries units of
        newcomers one after another and takes some (service/runtime/placement.py)."""
        pricing = AdmissionPricing(
            self.step_cost, self.encode_cost, self.place_cost, max_rows, tolerance
        )
        placement = Placement(self.rules, self.spans())
        return BatchPlan(placement, pricing, self.length_slack, EncodePrices.of(self.encode_cost))

    def spans(self) -> list[GroupSpan]:
        """What placement sees of each running group."""
        return [group.span for group in self._groups]

    # --- batch operations ------------------------------------------------------------------

    def validate(self, request: DecodeRequest) -> str | None:
        """Why ``request`` cannot be decoded, or None."""
        return self.model.info.refusal(request)

    def add(self, requests: list[DecodeRequest]) -> list[RejectedRequest]:
        """Encode the newcomers (the encoder calls of each length class) and place them in groups.
        Invalid requests are returned, rejected alone; the others are admitted."""
        encoded = self.encode(requests)
        self.place(encoded)
        return encoded.rejected

    def encode(self, requests: list[DecodeRequest]) -> EncodedRequests:
        """The first half of ``add``: validate and run the encoder, nothing joins the batch
        (service/runtime/encoding.py): another thread may run it while this one steps."""
        return encode_requests(
            self.kv, self.model.info, requests, self.length_slack, self.encode_cost
        )

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
        """Offline: add all sentences, step until they finish (service/runtime/offline.py)."""
        options = (beam_size, max_new_tokens, length_penalty, copy_tokens)
        return offline.translate_ids(self, src_ids, *options)

    def warmup(self) -> float:
        """A tiny greedy and beam translation (allocations, kernel selection); seconds."""
        return offline.warmup(self)

    def calibrate(self, **spread: Any) -> float:
        """Fit the step and encoder cost models to calls timed over a spread of shapes
        (service/runtime/calibration.py); returns seconds spent."""
        return calibration.calibrate(self.model, self.step_cost, self.encode_cost, **spread)
