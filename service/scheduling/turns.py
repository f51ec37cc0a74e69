"""Fair turns between models that share one device: round-robin, one engine step at a time.

Each model has its own batcher and engine thread. Left alone, the threads of a flooded
model and a quiet one compete for the same cores (ONNX Runtime already spreads one step over
all of them), so the quiet model's steps slow down with the flood's. Instead every engine
thread takes a turn from this scheduler around each admission + step: turns are granted one
at a time in the order they were asked for. A thread that has just stepped asks again and
queues behind the others, so while two models are busy their steps alternate exactly (step
counts differ by at most one), however many rows the flooded model holds. A model alone
takes turns without waiting.

Round-robin by steps, not weighted by cost: a step of a big batch costs more than a step of
a small one, so the flooded model still gets more of the device — but the quiet model's
latency in steps is what it would be alone, doubled at worst for two busy models. Cost
weighting would need timings; step counts keep it deterministic and testable.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager


class RoundRobinTurns:
    """Grants one turn at a time, in the order asked for (FIFO = round-robin between
    threads that ask again after each turn)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: deque[object] = deque()  # guarded by _cond: tickets in asking order
        self._holder: str | None = None  # guarded by _cond
        self.turns: Counter[str] = Counter()  # turns granted per model (guarded by _cond)

    @property
    def waiting(self) -> int:
        """Threads waiting for a turn now."""
        with self._cond:
            return len(self._waiting)

    @contextmanager
    def turn(self, model_id: str) -> Iterator[None]:
        """Block until it is ``model_id``'s turn; the turn lasts for the ``with`` body."""
        ticket = object()
        with self._cond:
            self._waiting.append(ticket)
            while self._holder is not None or self._waiting[0] is not ticket:
                self._cond.wait()
            self._waiting.popleft()
            self._holder = model_id
            self.turns[model_id] += 1
        try:
            yield
        finally:
            with self._cond:
                self._holder = None
                self._cond.notify_all()
