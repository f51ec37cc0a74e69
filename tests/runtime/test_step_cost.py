"""The step-cost model (service/runtime/step_cost.py) on synthetic timings: what it learns, where it
puts the knee, and that no fitted term is negative. No wall clock is read."""

from __future__ import annotations

import numpy as np
import pytest

from service.runtime.step_cost import (
    CallCostModel,
    EncodePrices,
    StepCostModel,
    StepShape,
    calls_features,
)


def cost(shape: StepShape, c0=1e-3, c1=2e-4, c2=1e-5, c3=2e-5, c4=1e-6) -> float:
    """The model's own form: c0 + c1 N + c2 N (P+1) + c3 N S + c4 N^2 (seconds)."""
    n = shape.rows
    return c0 + c1 * n + c2 * n * (shape.past_len + 1) + c3 * n * shape.width + c4 * n * n


SHAPES = [
    StepShape(rows, past, width)
    for rows in (1, 4, 8, 16, 32, 64)
    for past in (0, 16)
    for width in (8, 32)
]


def test_exact_timings_are_recovered():
    model = StepCostModel()
    model.calibrate((shape, cost(shape)) for shape in SHAPES)
    for shape in (StepShape(3, 5, 12), StepShape(48, 30, 20)):
        assert model.predict(shape) == pytest.approx(cost(shape), rel=1e-6)


def test_the_knee_lies_where_tokens_per_second_peak():
    """tokens/s = N / (c0 + c1 N + c4 N^2) peak at N = sqrt(c0 / c4) = 10 rows here."""
    terms = dict(c0=1e-3, c1=2e-4, c2=0.0, c3=0.0, c4=1e-5)
    model = StepCostModel()
    model.calibrate((shape, cost(shape, **terms)) for shape in SHAPES)
    assert model.best_rows(0, 8, max_rows=64, tolerance=0.0) == 10
    # a tolerance admits more rows for a little less throughput
    assert model.best_rows(0, 8, max_rows=64, tolerance=0.05) > 10
    # asked at every step as the past grows: shapes within one bucket share one computation
    computed = len(model._knees)
    assert model.best_rows(3, 9, max_rows=64, tolerance=0.0) == 10
    assert model.best_rows(7, 15, max_rows=64, tolerance=0.0) == 10
    assert len(model._knees) == computed  # the bucket of (0, 8): already known


@pytest.mark.parametrize("seed", range(6))
def test_without_a_row_squared_term_the_knee_is_the_cap(seed):
    """Timings that bend the other way (a slightly negative row-squared term, as noise on
    AVX-512 cores gives) fit without the term; linear in rows, tokens/s never fall as rows
    grow, and the knee the shortcut gives is the one the model's own predictions give."""
    rng = np.random.default_rng(seed)
    terms = dict(
        c0=rng.uniform(0, 2e-3) if seed else 0.0,
        c1=rng.uniform(1e-5, 3e-4),
        c2=rng.uniform(0, 2e-5),
        c3=1e-5,
        c4=-rng.uniform(1e-8, 2e-7),
    )
    model = StepCostModel()
    model.calibrate((shape, cost(shape, **terms)) for shape in SHAPES)
    assert model.coefficients[4] == 0.0  # dropped: no term may be negative
    counts = np.arange(1, 65)
    rates = counts / np.array([model.predict(StepShape(int(n), 20, 12)) for n in counts])
    for tolerance in (0.0, 0.05):
        expected = int(counts[rates >= rates.max() * (1 - tolerance) - 1e-9].max())
        assert expected == 64
        assert model.best_rows(20, 12, max_rows=64, tolerance=tolerance) == expected


def test_no_term_is_negative_on_noisy_timings():
    """Timings with no cost per cached position, plus noise that an unconstrained fit turns
    into a negative self-attention term: the fitted terms stay >= 0, the fit stays close."""
    rng = np.random.default_rng(3)
    terms = dict(c2=0.0, c4=0.0)
    samples = [(shape, cost(shape, **terms) * rng.uniform(0.8, 1.25)) for shape in SHAPES]
    unconstrained = np.linalg.lstsq(
        np.array(
            [
                [1, s.rows, s.rows * (s.past_len + 1), s.rows * s.width, s.rows**2]
                for s, _ in samples
            ],
            dtype=float,
        )
        / np.array([t for _, t in samples])[:, None],
        np.ones(len(samples)),
        rcond=None,
    )[0]
    assert (unconstrained < 0).any()  # the case this guards against
    model = StepCostModel()
    model.calibrate(samples)
    assert min(model.coefficients) >= 0
    for shape in SHAPES:
        assert model.predict(shape) == pytest.approx(cost(shape, **terms), rel=0.3)


def test_live_steps_move_the_fit_toward_what_steps_really_cost():
    """Calibration saw decoder calls alone; live steps (host work included) cost more. After
    a window of them the predictions follow the live cost."""
    model = StepCostModel(window=64, refit_every=8)
    model.calibrate((shape, cost(shape)) for shape in SHAPES)
    live = StepShape(8, 10, 12)
    before = model.predict(live)
    for _ in range(64):
        model.observe(live, 2 * cost(live))
    assert before == pytest.approx(cost(live), rel=1e-6)
    assert model.predict(live) > 1.5 * cost(live)


def _encoder_calls(model: CallCostModel, with_cpu: bool) -> None:
    """Encoder calls of 1-12 rows of 4-16 tokens, timed wall (0.5 ms a call, 0.6 ms a
    token: long calls stretched by other threads) and CPU (2 ms a call, 0.15 ms a token)."""
    for rows in (1, 2, 3, 5, 8, 12):
        for width in (4, 8, 16):
            features = calls_features([[width] * rows])
            tokens = rows * width
            wall = 0.0005 + 0.0006 * tokens
            cpu = 0.002 + 0.00015 * tokens
            model.observe(features, wall, cpu if with_cpu else None)


def test_the_encoder_cut_is_priced_by_the_cpu_its_calls_cost_where_observed() -> None:
    model = CallCostModel(features=3)
    _encoder_calls(model, with_cpu=True)
    prices = EncodePrices.of(model)
    assert prices is not None
    assert prices.per_call == pytest.approx(0.002, rel=0.02)
    assert prices.per_token == pytest.approx(0.00015, rel=0.02)
    assert model.coefficients[0] == pytest.approx(0.0005, rel=0.02)  # predictions stay wall


def test_without_cpu_samples_the_encoder_cut_is_priced_by_wall_time() -> None:
    model = CallCostModel(features=3)
    _encoder_calls(model, with_cpu=False)
    prices = EncodePrices.of(model)
    assert prices is not None
    assert prices.per_call == pytest.approx(0.0005, rel=0.02)
