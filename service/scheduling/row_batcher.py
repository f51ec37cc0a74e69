"""``RowBatcher``: what the translator and the registry call on a model's batcher, whether it
runs in this process (``ContinuousBatcher``) or in engine-core processes behind a socket
(``service.engine_core.client.EngineCoreClient``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.metrics import ServiceMetrics
from service.runtime.types import DecodeRequest
from service.scheduling.sentences import RowResult
from service.scheduling.stream import RowStream


class RowBatcher(Protocol):
    metrics: ServiceMetrics
    max_queue: int

    @property
    def accepting(self) -> bool: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def alive(self) -> bool: ...

    def start(self) -> None: ...
    async def until_live(self) -> None: ...
    async def submit(
        self,
        rows: Sequence[DecodeRequest],
        timeout_s: float | None = None,
        background: bool = False,
    ) -> list[RowResult]: ...
    def submit_as_completed(
        self,
        rows: Sequence[DecodeRequest],
        timeout_s: float | None = None,
        background: bool = False,
    ) -> RowStream: ...
    def begin_shutdown(self) -> None: ...
    async def shutdown(self, grace_s: float) -> bool: ...
