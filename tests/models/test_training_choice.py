"""The rule that picks a default model's architecture from quality and speed measurements."""

import pytest

from models.training.choose import choose_architecture


def test_fastest_candidate_within_tolerance_of_the_best_wins() -> None:
    chrf = {"small": 58.2, "deep": 58.6, "wide": 59.5}
    speed = {"small": 1.0, "deep": 0.95, "wide": 0.45}
    assert choose_architecture(chrf, speed, tolerance=0.5) == "wide"  # others too far behind
    assert choose_architecture(chrf, speed, tolerance=1.5) == "small"  # small is close enough


def test_equal_speed_goes_to_better_quality() -> None:
    assert choose_architecture({"a": 50.0, "b": 50.4}, {"a": 1.0, "b": 1.0}) == "b"


def test_a_candidate_without_speed_measurement_is_never_chosen() -> None:
    assert choose_architecture({"a": 50.0, "b": 60.0}, {"a": 1.0}) == "a"
    with pytest.raises(ValueError):
        choose_architecture({"a": 50.0}, {"b": 1.0})
