"""The engine as the scheduling package sees it: the protocols its parts call.

``CostedEngine`` is what choosing newcomers asks (service/scheduling/chooser.py);
``DecodeEngine`` adds the batch operations the engine thread runs
(service/scheduling/engine_loop.py). ``service.runtime.engine.Engine`` is the one
implementation; tests hand in fakes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from service.runtime.groups import EncodedRequests
from service.runtime.types import BatchEstimate, DecodeRequest, FinishedRequest
from service.scheduling.admission import AdmissionTrials


class CostedEngine(Protocol):
    """What choosing newcomers asks of the engine (part of ``DecodeEngine``)."""

    @property
    def steps(self) -> int: ...
    def estimate(
        self, newcomers: Sequence[tuple[int, int]] = (), max_rows: int = 64, tolerance: float = 0.0
    ) -> BatchEstimate: ...
    def plan(self, max_rows: int = 64, tolerance: float = 0.0) -> AdmissionTrials: ...


@runtime_checkable
class DecodeEngine(CostedEngine, Protocol):
    """Everything the batcher calls on ``service.runtime.engine.Engine``: what choosing
    newcomers asks (``CostedEngine``: steps, estimate, plan) and the batch operations."""

    @property
    def active_rows(self) -> int: ...
    @property
    def groups(self) -> int: ...

    # seconds inside decoder calls so far: the rest of a step is host work (the timeline)
    decoder_seconds: float

    def encode(self, requests: list[DecodeRequest]) -> EncodedRequests: ...
    def place(self, encoded: EncodedRequests) -> None: ...
    def step(self) -> list[FinishedRequest]: ...
    def drop(self, request_ids: Iterable[Hashable]) -> None: ...
