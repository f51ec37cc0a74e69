"""Cutting a length class into encoder calls (service/runtime/placement.py ``encoder_calls``)
against a brute force over every cut."""

from __future__ import annotations

import itertools
import random

import pytest

from service.runtime.placement import encoder_calls, length_classes
from service.runtime.step_cost import CallCostModel, EncodePrices, calls_features


def _seconds(calls: list[list[int]], prices: EncodePrices) -> float:
    return sum(prices.per_call + len(call) * prices.per_row(max(call)) for call in calls)


def _cheapest_by_brute_force(lengths: list[int], prices: EncodePrices) -> float:
    """Every way to cut the sorted lengths into runs (2^(n-1) of them), priced."""
    best = float("inf")
    for mask in range(2 ** (len(lengths) - 1)):
        calls, start = [], 0
        for gap in range(1, len(lengths)):
            if mask >> (gap - 1) & 1:
                calls.append(lengths[start:gap])
                start = gap
        calls.append(lengths[start:])
        best = min(best, _seconds(calls, prices))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_the_cut_is_the_cheapest_of_all_cuts(seed):
    rng = random.Random(seed)
    lengths = sorted(rng.randint(1, 40) for _ in range(rng.randint(2, 11)))
    prices = EncodePrices(
        per_call=rng.choice([0.0, 1e-4, 1e-3, 5e-3]),
        per_token=rng.uniform(5e-5, 2e-4),
        per_row_squared=rng.choice([0.0, 1e-7, 1e-6]),
    )
    calls = encoder_calls(lengths, lambda length: length, prices)
    assert list(itertools.chain(*calls)) == lengths  # every item once, in order
    assert all(calls)
    assert _seconds(calls, prices) == pytest.approx(_cheapest_by_brute_force(lengths, prices))


def test_the_prices_decide_between_one_call_and_one_per_length():
    lengths = [3, 3, 5, 9, 9, 9, 16]
    itself = lambda length: length  # noqa: E731
    free_calls = EncodePrices(per_call=0.0, per_token=1e-4, per_row_squared=0.0)
    assert encoder_calls(lengths, itself, free_calls) == [[3, 3], [5], [9, 9, 9], [16]]
    dear_calls = EncodePrices(per_call=1.0, per_token=1e-4, per_row_squared=0.0)
    assert encoder_calls(lengths, itself, dear_calls) == [lengths]
    # Unfitted: nothing is known about the machine, so the class stays one call.
    assert encoder_calls(lengths, itself, None) == [lengths]


def test_a_class_of_ui_strings_is_cut_where_padding_costs_more_than_a_call():
    """The measured shape of the default model on one AVX-512 core: about 1.2 ms a call and
    0.14 ms a padded token (2026-11-24). Five strings of 5 tokens and one of 10 share a class
    (10 - 5 <= 5); padding the five to 10 costs 25 tokens, 3.5 ms, against 1.2 ms for a
    second call."""
    prices = EncodePrices(per_call=1.2e-3, per_token=1.4e-4, per_row_squared=0.0)
    lengths = [5, 5, 5, 5, 5, 10]
    (length_class,) = length_classes(lengths, lambda length: length, slack=8)
    assert encoder_calls(length_class, lambda length: length, prices) == [[5] * 5, [10]]
    # A single long string below them is not worth a call of its own: 2 tokens of padding.
    assert encoder_calls([8, 10, 10, 10], lambda length: length, prices) == [[8, 10, 10, 10]]


def test_prices_come_from_the_fitted_encoder_model_in_its_feature_units():
    model = CallCostModel(features=3)
    assert EncodePrices.of(model) is None
    calls = [[4, 4, 6], [9, 12], [20]]
    for scale in (1, 2, 3, 5, 8, 13):
        # seconds = 2 ms a call + 0.1 ms a padded token + 0.01 us a row's S^2, exactly
        scaled = [[length * scale for length in call] for call in calls]
        tokens = sum(len(call) * max(call) for call in scaled)
        squared = sum(len(call) * max(call) ** 2 for call in scaled)
        model.observe(calls_features(scaled), 2e-3 * 3 + 1e-4 * tokens + 1e-8 * squared)
    prices = EncodePrices.of(model)
    assert prices is not None
    assert prices.per_call == pytest.approx(2e-3, rel=1e-3)
    assert prices.per_token == pytest.approx(1e-4, rel=1e-3)
    assert prices.per_row_squared == pytest.approx(1e-8, rel=1e-2)
    assert prices.per_row(10) == pytest.approx(1e-4 * 10 + 1e-8 * 100, rel=1e-2)
