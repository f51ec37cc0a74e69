"""What the load generator sends and when: input sampling and the Poisson schedule."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.inputs import CATEGORIES, HELP_PARAGRAPHS, UI_STRINGS, InputSampler, parse_weights
from loadtest.open_loop import poisson_schedule


def test_input_pool_has_about_150_distinct_strings():
    assert len(set(UI_STRINGS)) == len(UI_STRINGS) >= 90
    assert len(set(HELP_PARAGRAPHS)) == len(HELP_PARAGRAPHS) >= 40
    assert all(len(p) > 100 and p.count(". ") >= 1 for p in HELP_PARAGRAPHS)


def test_sampler_is_deterministic_for_a_seed_and_differs_across_seeds():
    a = InputSampler(seed=7)
    b = InputSampler(seed=7)
    c = InputSampler(seed=8)
    seq_a = [a.next_payload() for _ in range(50)]
    assert seq_a == [b.next_payload() for _ in range(50)]
    assert seq_a != [c.next_payload() for _ in range(50)]


def test_sampler_follows_the_category_weights():
    sampler = InputSampler(seed=1, weights={"ui": 0.8, "help": 0.2})
    help_texts = set(HELP_PARAGRAPHS)
    draws = [sampler.next_text() for _ in range(4000)]
    help_share = sum(text in help_texts for text in draws) / len(draws)
    assert help_share == pytest.approx(0.2, abs=0.03)
    only_ui = InputSampler(seed=1, weights={"ui": 1.0, "help": 0.0})
    assert all(only_ui.next_text() in UI_STRINGS for _ in range(200))


def test_payload_carries_lists_and_decoding_options():
    payload = InputSampler(
        seed=0, texts_per_request=3, beam_size=4, max_new_tokens=32
    ).next_payload()
    assert isinstance(payload["text"], list) and len(payload["text"]) == 3
    assert payload["beam_size"] == 4 and payload["max_new_tokens"] == 32
    assert set(InputSampler(seed=0).next_payload()) == {"text"}


def test_mix_parsing_rejects_unknown_categories():
    assert parse_weights("ui=0.6, help=0.4") == {"ui": 0.6, "help": 0.4}
    with pytest.raises(ValueError):
        parse_weights("poetry=1")
    with pytest.raises(ValueError):
        InputSampler(weights={"ui": 0.0, "help": 0.0})
    assert set(CATEGORIES) == {"ui", "help"}


def test_poisson_schedule_mean_interarrival_matches_the_rate():
    rate = 5.0
    offsets = poisson_schedule(rate, count=4000, seed=3)
    gaps = np.diff([0.0, *offsets])
    assert len(offsets) == 4000
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    # Exponential gaps: standard deviation equals the mean.
    assert gaps.std() == pytest.approx(1 / rate, rel=0.1)
    assert all(b > a for a, b in zip(offsets, offsets[1:], strict=False))


def test_poisson_schedule_is_reproducible_and_bounded_by_duration():
    assert poisson_schedule(2.0, duration_s=30, seed=1) == poisson_schedule(
        2.0, duration_s=30, seed=1
    )
    offsets = poisson_schedule(10.0, duration_s=60, seed=2)
    assert offsets[-1] <= 60
    assert len(offsets) == pytest.approx(600, rel=0.15)
    assert len(poisson_schedule(10.0, duration_s=60, count=25, seed=2)) == 25
    with pytest.raises(ValueError):
        poisson_schedule(1.0)
