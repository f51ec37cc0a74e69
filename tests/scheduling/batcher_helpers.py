"""The continuous batcher's tests run against a deterministic fake engine.

The fake's "translation" of a sentence is its source ids reversed (eos left out), one token
per step, so every result and every step count is known in advance. Tests that need the
engine to hold still use a gate: each decoder step waits for a permit from the test.
Nothing in these tests asserts on wall time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from service.runtime.types import BatchEstimate, DecodeRequest, FinishedRequest, RejectedRequest

EOS = 0


@dataclass
class FakeEncoded:
    requests: list[DecodeRequest]
    rejected: list[RejectedRequest] = field(default_factory=list)

    @property
    def request_ids(self) -> list[Hashable]:
        return [request.request_id for request in self.requests]


class FakePlan:
    """``Engine.plan`` for the fake: the estimate over what was taken and the newcomers."""

    def __init__(self, engine: FakeEngine, max_rows: int, tolerance: float) -> None:
        self._engine = engine
        self._max_rows = max_rows
        self._tolerance = tolerance
        self._taken: list[tuple[int, int]] = []

    def estimate(self, newcomers) -> BatchEstimate:
        return self._engine.estimate([*self._taken, *newcomers], self._max_rows, self._tolerance)

    def take(self, newcomers) -> None:
        self._taken.extend(newcomers)


class FakeEngine:
    """Same interface as ``service.runtime.engine.Engine``; records what the batcher asked of it."""

    def __init__(self) -> None:
        self.steps = 0
        self.decoder_seconds = 0.0
        # request id -> (request, its whole "translation", tokens produced so far)
        self._active: dict[Hashable, tuple[DecodeRequest, list[int], list[int]]] = {}
        self.admissions: list[tuple[int, list[Hashable]]] = []  # (steps at add, ids)
        self.rows_per_step: list[int] = []
        self.widths_per_step: list[int] = []
        self.dropped: list[Hashable] = []
        self.fail_next_step = False
        self.past_len = 0  # what every row of the batch is padded to (one group)
        # rows -> tokens/s, standing in for the engine's step-cost model (None: not fitted)
        self.throughput: Callable[[int], float] | None = None
        self.reject_sources: set[tuple[int, ...]] = set()  # add() refuses these alone
        self.encoded_on: list[str] = []  # the thread of each encoder call
        # Costs, standing in for the engine's cost models (None: not fitted): seconds of a step
        # of so many rows, of encoding one source token, of merging newcomers into the batch.
        self.step_seconds: Callable[[int], float] | None = None
        self.encode_seconds = 0.0
        self.place_seconds = 0.0

    @staticmethod
    def expected(src_ids: Iterable[int], max_new_tokens: int = 10**9) -> list[int]:
        return [token for token in reversed(list(src_ids)) if token != EOS][:max_new_tokens]

    @property
    def active_requests(self) -> int:
        return len(self._active)

    @property
    def active_rows(self) -> int:
        return sum(request.beam_size for request, _, _ in self._active.values())

    @property
    def groups(self) -> int:
        return 1 if self._active else 0

    def add(self, requests: list[DecodeRequest]) -> list[RejectedRequest]:
        rejected = []
        for request in requests:
            if tuple(request.src_ids) in self.reject_sources:
                rejected.append(RejectedRequest(request.request_id, "refused by the test"))
                continue
            target = self.expected(request.src_ids, request.max_new_tokens)
            self._active[request.request_id] = (request, target, [])
        self.admissions.append((self.steps, [request.request_id for request in requests]))
        return rejected

    def encode(self, requests: list[DecodeRequest]) -> FakeEncoded:
        self.encoded_on.append(threading.current_thread().name)
        return FakeEncoded(list(requests))

    def place(self, encoded: FakeEncoded) -> None:
        encoded.rejected = self.add(encoded.requests)

    def plan(self, max_rows: int = 64, tolerance: float = 0.0) -> FakePlan:
        return FakePlan(self, max_rows, tolerance)

    def estimate(self, newcomers=(), max_rows: int = 64, tolerance: float = 0.0) -> BatchEstimate:
        rows = self.active_rows + sum(count for count, _ in newcomers)
        width = max(
            [len(r.src_ids) for r, _, _ in self._active.values()]
            + [length for _, length in newcomers],
            default=0,
        )
        costs = {}
        if self.step_seconds is not None:
            costs = {
                "step_s": self.step_seconds(rows),
                "encode_s": self.encode_seconds * sum(length for _, length in newcomers),
                "place_s": self.place_seconds if newcomers and self._active else 0.0,
            }
        if self.throughput is None:
            return BatchEstimate(rows, rows * (width + self.past_len), **costs)
        rates = [self.throughput(count) for count in range(1, max_rows + 1)]
        limit = max(c for c, rate in enumerate(rates, 1) if rate >= max(rates) * (1 - tolerance))
        return BatchEstimate(rows, rows * (width + self.past_len), row_limit=limit, **costs)

    def step(self) -> list[FinishedRequest]:
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("device lost")
        self.steps += 1
        self.rows_per_step.append(self.active_rows)
        self.widths_per_step.append(max(len(r.src_ids) for r, _, _ in self._active.values()))
        finished = []
        for request_id, (_, target, produced) in list(self._active.items()):
            if len(produced) < len(target):
                produced.append(target[len(produced)])
            if len(produced) == len(target):
                finished.append(FinishedRequest(request_id, produced, len(produced)))
                del self._active[request_id]
        return finished

    def drop(self, request_ids: Iterable[Hashable]) -> None:
        for request_id in request_ids:
            if self._active.pop(request_id, None) is not None:
                self.dropped.append(request_id)


class GatedEngine(FakeEngine):
    """Each step waits for a permit, so a test decides when the engine moves."""

    def __init__(self) -> None:
        super().__init__()
        # A count under a condition rather than a semaphore: ``allow(10**6)`` (let the engine
        # run freely) is one addition, not a million releases.
        self._gate = threading.Condition()
        self._permits = 0  # guarded by _gate
        self.waiting = threading.Event()  # set while a step waits for its permit

    def step(self) -> list[FinishedRequest]:
        self.waiting.set()
        with self._gate:
            self._gate.wait_for(lambda: self._permits > 0)
            self._permits -= 1
        self.waiting.clear()
        return super().step()

    def allow(self, steps: int = 1) -> None:
        with self._gate:
            self._permits += steps
            self._gate.notify()


class SlowEngine(FakeEngine):
    """A millisecond per step: a long sentence outlasts a short shutdown grace."""

    def step(self) -> list[FinishedRequest]:
        time.sleep(0.001)
        return super().step()


class OverlapEngine(GatedEngine):
    """``add`` in two halves, as the real engine: ``encode`` (on the batcher's encoder thread
    when rows are running) can be held back or made to fail; ``place`` joins the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.release_encoder = threading.Event()
        self.release_encoder.set()
        self.fail_sources: set[tuple[int, ...]] = set()

    def encode(self, requests: list[DecodeRequest]) -> FakeEncoded:
        self.encoded_on.append(threading.current_thread().name)
        self.release_encoder.wait(10)
        if any(tuple(request.src_ids) in self.fail_sources for request in requests):
            raise RuntimeError("encoder blew up")
        return FakeEncoded(list(requests))


class FakeClock:
    """A clock the test moves by hand (admission waits without wall-clock asserts)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sentence(length: int, first: int = 1, **options) -> DecodeRequest:
    """A source of ``length`` ids ending in eos."""
    return DecodeRequest(src_ids=tuple(range(first, first + length - 1)) + (EOS,), **options)


async def wait_until(predicate, what: str) -> None:
    """Yield to the engine thread until ``predicate()`` holds (a bounded number of times)."""
    for _ in range(5000):
        if predicate():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"never happened: {what}")


async def step_until(engine: GatedEngine, predicate, what: str) -> None:
    """Let the engine take one step at a time until ``predicate()`` holds (an encoding on the
    encoder thread joins at the first step boundary after it is done, however many steps)."""
    for _ in range(5000):
        if predicate():
            return
        if engine.waiting.is_set():
            engine.allow(1)
        await asyncio.sleep(0.002)
    raise AssertionError(f"never happened: {what}")


async def a_running_row_and_a_newcomer(
    batcher, engine, running_row, newcomer_row, steps_first: int = 0
):
    """``running_row`` decodes (held after ``steps_first`` steps); ``newcomer_row`` then waits
    in the queue. Returns both submissions' tasks."""
    running = asyncio.ensure_future(batcher.submit([running_row]))
    engine.allow(steps_first)
    await wait_until(
        lambda: engine.steps == steps_first and engine.waiting.is_set(), "first row decoding"
    )
    newcomer = asyncio.ensure_future(batcher.submit([newcomer_row]))
    await wait_until(lambda: batcher.queue_depth == 1, "newcomer queued")
    return running, newcomer


def one_core_costs(engine: FakeEngine) -> None:
    """Costs as on one core, where the encoder runs in line: a 10 ms step (+1 ms a row),
    4 ms of encoder per source token, 1 ms to merge newcomers into the batch."""
    engine.step_seconds = lambda rows: 0.010 + 0.001 * rows
    engine.encode_seconds = 0.004
    engine.place_seconds = 0.001
