"""What a decoder step costs, learned from the engine's own timings.

A decoder call over N rows with P cached target positions and sources padded to S tokens
costs, to a good approximation,

    seconds ~ c0 + c1 N + c2 N (P + 1) + c3 N S + c4 N^2

c0 is the per-call overhead, c1 the per-row matmuls (projections, feed-forward, output layer),
c2 self-attention over the cache, c3 cross-attention over the source; c4 lets the fit bend
where a batch outgrows the CPU's caches (measured on 2 AVX2 cores: the default model's
tokens/s *falls* from 8 to 32 rows). On a GPU the fitted c1 and c4 come out near zero and the
knee lies far out; on 2 CPU cores it comes early. The same code finds both: it is a least-squares
fit over

- calibration points, timed once at start-up over a spread of shapes (kept for good: live
  traffic covers a narrow range of shapes, and the fit must not extrapolate blindly), and
- a window of the most recent live steps (so the fit follows the machine as it is now). A
  live step is timed whole, host work included (step inputs, the searches, cache
  rearrangement), so the fit learns what a step really costs, not just the decoder call;
  calibration times decoder calls alone and the live window (512 steps against 48 points)
  soon outweighs it.

No coefficient is negative (a non-negative least-squares fit): every term is a cost.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from service.runtime.types import BatchEstimate


@dataclass(frozen=True)
class StepShape:
    """One decoder call: rows, cached target positions, padded source length."""

    rows: int
    past_len: int
    width: int


def _terms(rows, past_len: int, width: int) -> tuple:
    """The five terms of the cost model (module docstring) for ``rows``: a float (one call) or
    an array of row counts (one term array each)."""
    return (
        rows * 0.0 + 1.0,
        rows,
        rows * (past_len + 1) / 64.0,
        rows * width / 64.0,
        rows * rows / 64.0,
    )


def _row_features(rows: np.ndarray, past_len: int, width: int) -> np.ndarray:
    """(R,) row counts -> (R, 5) features of a call of each count at this past and width."""
    return np.stack(_terms(rows, past_len, width), axis=-1)


Features = tuple[float, float, float, float, float]  # one call's row of _row_features


def _features(shape: StepShape) -> Features:
    """``_row_features`` of one call in plain floats: the engine observes every step, and a
    numpy call per feature cost more than the rest of the bookkeeping (17-70 us per step)."""
    return _terms(float(shape.rows), shape.past_len, shape.width)


def _non_negative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| with x >= 0, by dropping the most negative term and refitting.

    Every term is a cost (overhead, per row, per cached position, per source position, the
    batch's bend), so none may be negative. An unconstrained fit on noisy timings (another
    process on the cores during calibration) gave negative attention terms and put the knee
    at the row cap; a term the data cannot support is dropped (0) instead."""
    active = np.ones(a.shape[1], dtype=bool)
    coefficients = np.zeros(a.shape[1])
    while active.any():
        solution, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (solution >= 0).all():
            coefficients[active] = solution
            break
        active[np.flatnonzero(active)[int(solution.argmin())]] = False
    return coefficients


def _fit_relative(
    samples: Sequence[tuple[tuple[float, ...], float]],
) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative coefficients of ``(features, seconds)`` samples, and the seconds.
    Relative error matters (a 1 ms call and a 100 ms call are equally important to get right
    in proportion): each sample is weighted by 1 / its duration."""
    features = np.array([f for f, _ in samples])  # (samples, terms)
    seconds = np.array([s for _, s in samples])
    weights = 1.0 / np.maximum(seconds, 1e-5)
    return _non_negative_least_squares(features * weights[:, None], seconds * weights), seconds


class _FittedCost:
    """What every cost model here shares: the coefficients of its last fit (None before
    one), how often it refits, and the lock that guards both."""

    def __init__(self, refit_every: int) -> None:
        self._refit_every = refit_every
        self._since_fit = 0
        self._coefficients: list[float] | None = None  # plain floats: predictions run per step
        self._lock = threading.Lock()

    @property
    def fitted(self) -> bool:
        return self._coefficients is not None

    @property
    def coefficients(self) -> list[float]:
        return list(self._coefficients or [])


class StepCostModel(_FittedCost):
    """Least-squares fit of decoder-call seconds over calibration and recent live steps.

    Thread-safe: the engine thread observes, the batcher (same thread) and metrics read."""

    def __init__(self, window: int = 512, refit_every: int = 32) -> None:
        super().__init__(refit_every)
        self._calibration: list[tuple[Features, float]] = []
        self._recent: deque[tuple[Features, float]] = deque(maxlen=window)
        self._coefficient_array: np.ndarray | None = None  # the fit as an array (``best_rows``)
        self._floor = 0.0
        self._knees: dict[tuple[int, int, int, float], int] = {}  # best_rows of this fit

    def calibrate(self, samples: Iterable[tuple[StepShape, float]]) -> None:
        with self._lock:
            self._calibration = [(_features(shape), seconds) for shape, seconds in samples]
            self._fit()

    def observe(self, shape: StepShape, seconds: float) -> None:
        with self._lock:
            self._recent.append((_features(shape), seconds))
            self._since_fit += 1
            if self._since_fit >= self._refit_every:
                self._fit()

    def _fit(self) -> None:
        samples = self._calibration + list(self._recent)
        self._since_fit = 0
        if len(samples) < 6:
            return
        self._coefficient_array, seconds = _fit_relative(samples)
        self._coefficients = [float(c) for c in self._coefficient_array]
        self._floor = float(seconds.min()) * 0.5
        self._knees = {}

    def predict(self, shape: StepShape) -> float:
        """Seconds of one decoder call of ``shape`` (0 before any fit)."""
        if self._coefficients is None:
            return 0.0
        # plain floats: the batcher asks this many times between two steps, and numpy's
        # per-call overhead would be most of the cost of a 5-term dot product
        c0, c1, c2, c3, c4 = self._coefficients
        rows = shape.rows
        seconds = c0 + rows * (c1 + (c2 * (shape.past_len + 1) + c3 * shape.width + c4 * rows) / 64)
        return max(seconds, self._floor)

    def step_seconds(self, shapes: Iterable[StepShape]) -> float:
        """One engine step = one decoder call per group."""
        return sum(self.predict(shape) for shape in shapes)

    def row_limit(self, shapes: Sequence[StepShape], max_rows: int, tolerance: float) -> int | None:
        """``best_rows`` at the mean past and source length of a batch of ``shapes`` (None
        before the model is fitted, or for an empty batch)."""
        rows = sum(shape.rows for shape in shapes)
        if not self.fitted or not rows:
            return None
        past = round(sum(s.rows * s.past_len for s in shapes) / rows)
        width = round(sum(s.rows * s.width for s in shapes) / rows)
        return self.best_rows(past, width, max_rows, tolerance)

    def best_rows(self, past_len: int, width: int, max_rows: int, tolerance: float) -> int:
        """The most rows (1..max_rows) of one call of this past and width whose tokens/s stay
        within ``tolerance`` of the best row count's: this machine's knee."""
        # The batcher asks once per queued candidate, and the past grows at every step: the
        # knee moves little within KNEE_BUCKET positions, so it is computed once per bucket.
        past_len, width = _bucket(past_len), _bucket(width)
        key = (past_len, width, max_rows, tolerance)
        knee = self._knees.get(key)
        if knee is None:
            coefficients = self._coefficient_array
            if coefficients is None or self._coefficients is None:
                return max_rows
            if self._coefficients[4] == 0.0:
                # No row-squared term (the fit dropped it, as on AVX-512 cores): a call's
                # seconds are linear in rows, so tokens/s never fall as rows grow and the knee
                # is the cap; no need for the arrays (misses come every few steps: the past
                # moves to the next bucket, a refit clears the cache).
                knee = max_rows
            else:
                counts = np.arange(1, max_rows + 1, dtype=np.float64)
                features = _row_features(counts, past_len, width)  # (max_rows, 5)
                rates = counts / np.maximum(features @ coefficients, self._floor)
                knee = int(counts[rates >= rates.max() * (1 - tolerance)].max())
            self._knees[key] = knee
        return knee


KNEE_BUCKET = 8


def _bucket(positions: int) -> int:
    """The middle of ``positions``' bucket of KNEE_BUCKET positions."""
    return positions // KNEE_BUCKET * KNEE_BUCKET + KNEE_BUCKET // 2


class CallCostModel(_FittedCost):
    """Seconds of a call as a non-negative linear function of a few features, fitted over a
    window of recent calls (the encoder call of newcomers, the merge that places them).

    The admission policy asks what letting newcomers in costs the running rows; these calls
    are what it costs besides the wider steps. Thread-safe: the encoder thread observes its
    calls while the engine thread predicts."""

    def __init__(self, features: int, window: int = 256, refit_every: int = 8) -> None:
        super().__init__(refit_every)
        self._samples: deque[tuple[tuple[float, ...], float]] = deque(maxlen=window)
        self._features = features
        # The calling thread's CPU seconds of the same calls, where the caller gives them
        # (``cpu_coefficients``).
        self._cpu_samples: deque[tuple[tuple[float, ...], float]] = deque(maxlen=window)
        self._cpu_coefficients: list[float] | None = None

    def observe(
        self, features: tuple[float, ...], seconds: float, cpu_seconds: float | None = None
    ) -> None:
        with self._lock:
            self._samples.append((features, seconds))
            if cpu_seconds is not None:
                self._cpu_samples.append((features, cpu_seconds))
            self._since_fit += 1
            if self._since_fit >= self._refit_every or self._coefficients is None:
                self._fit()

    def _fit(self) -> None:
        self._since_fit = 0
        if len(self._samples) < 4:
            return
        fit, _ = _fit_relative(list(self._samples))
        self._coefficients = [float(c) for c in fit]
        if len(self._cpu_samples) >= 4:
            cpu_fit, _ = _fit_relative(list(self._cpu_samples))
            self._cpu_coefficients = [float(c) for c in cpu_fit]

    @property
    def cpu_coefficients(self) -> list[float]:
        """The fit of the calls' CPU seconds on the calling thread, where observed (else the
        wall-clock fit): what a call costs the core, not how long it took. On one core a
        long call's wall time stretches with the other threads' work while it runs (the
        event loop's, with the GIL released), so a wall-clock fit prices its tokens above
        its fixed cost (measured serving 32 clients: 1.8 ms a call against 0.59 ms a
        token, where the CPU is 2.0 ms against 0.19 ms)."""
        coefficients = self._cpu_coefficients or self._coefficients
        return list(coefficients or [])

    def predict(self, features: tuple[float, ...]) -> float:
        """Seconds (0 before any fit: nothing is known, so nothing is charged)."""
        coefficients = self._coefficients
        if coefficients is None:
            return 0.0
        return sum(c * f for c, f in zip(coefficients, features, strict=True))


def encode_features(calls: int, tokens: int, squared: int) -> tuple[float, float, float]:
    """An admission's encoder work: calls, padded source tokens over all rows, and the sum of
    rows x S^2 (self-attention over each padded source)."""
    return (float(calls), tokens / 64.0, squared / 4096.0)


def calls_features(calls: Sequence[Sequence[int]]) -> tuple[float, float, float]:
    """``encode_features`` of encoder calls given as each call's source lengths (a call pads
    every source to its longest)."""
    tokens = sum(len(call) * max(call) for call in calls)
    squared = sum(len(call) * max(call) ** 2 for call in calls)
    return encode_features(len(calls), tokens, squared)


@dataclass(frozen=True)
class EncodePrices:
    """The fitted encoder cost (``encode_features``' coefficients) per unit: seconds a call,
    a padded source token, and a row's S^2. What cutting a length class into calls weighs."""

    per_call: float
    per_token: float
    per_row_squared: float

    @classmethod
    def of(cls, model: CallCostModel) -> EncodePrices | None:
        """The CPU prices of ``model`` (``CallCostModel.cpu_coefficients``): the cut trades
        a call's fixed cost against padding, both paid in the core's time. None before the
        model is fitted: nothing is known, so nothing is cut finer."""
        coefficients = model.cpu_coefficients
        if not coefficients:
            return None
        per_call, per_64_tokens, per_4096_squared = coefficients
        return cls(per_call, per_64_tokens / 64.0, per_4096_squared / 4096.0)

    def per_row(self, width: int) -> float:
        """Seconds one row padded to ``width`` source tokens adds to a call."""
        return self.per_token * width + self.per_row_squared * width * width


def merge_features(calls: int, copied: int) -> tuple[float, float]:
    """Placing encoded newcomers: merges, and the cache positions copied (rows x (P + S) of
    every group they join)."""
    return (float(calls), copied / 64.0)


@dataclass(frozen=True)
class AdmissionPricing:
    """What a batch with newcomers would cost by one engine's three cost models: the what-if
    pricing of an admission, before anything moves. ``max_rows`` and ``tolerance`` say where
    the knee (``StepCostModel.best_rows``) is looked for."""

    step: StepCostModel
    encode: CallCostModel
    place: CallCostModel
    max_rows: int
    tolerance: float

    def estimate(
        self,
        running: Sequence[StepShape],
        joined: Sequence[StepShape],
        opened: Sequence[StepShape],
        encoder_calls: Sequence[Sequence[int]],
    ) -> BatchEstimate:
        """The batch once newcomers have joined: ``running``, the running groups as they are;
        ``joined``, the same groups with the newcomers that join them; ``opened``, the groups
        newcomers open; ``encoder_calls``, the newcomers' encoder calls as the source lengths
        of each (beams share their sentence's call)."""
        shapes = [*joined, *opened]
        return BatchEstimate(
            rows=sum(shape.rows for shape in shapes),
            padded_tokens=sum(shape.rows * (shape.past_len + shape.width) for shape in shapes),
            row_limit=self.step.row_limit(shapes, self.max_rows, self.tolerance),
            step_s=self.step.step_seconds(shapes),
            encode_s=self.encode.predict(calls_features(encoder_calls)) if encoder_calls else 0.0,
            place_s=self._place_seconds(running, joined),
        )

    def _place_seconds(self, running: Sequence[StepShape], joined: Sequence[StepShape]) -> float:
        """Merging the newcomers into the running groups they join (groups they open cost
        no copy)."""
        joins = copied = 0
        for before, after in zip(running, joined, strict=True):
            if after.rows != before.rows:
                joins += 1
                copied += after.rows * (after.past_len + after.width)
        if not joins:
            return 0.0
        return self.place.predict(merge_features(joins, copied))
