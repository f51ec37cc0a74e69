"""The admitter's runs: ``take_run`` takes what ``try_unit`` over the units in turn takes.

The reference is the one-unit-at-a-time loop the scheduler ran before runs (kept here as
``_fill_one_by_one``; ``Admitter.fill`` replaced it). The plan is a fake whose rows, padded
tokens and encoder seconds grow as units join, with a knee, a token budget, a stall bound
and rows of several beams, so every verdict occurs. Nothing here times anything.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from service.runtime.types import BatchEstimate, DecodeRequest
from service.scheduling.admission import AdmissionLimits, Admitter, Verdict
from service.scheduling.sentences import ScheduledSentence


class GrowingPlan:
    """Estimates over the running rows, what was taken and the newcomers; counts its calls."""

    def __init__(self, running_rows: int, running_width: int, knee: int | None) -> None:
        self.running_rows = running_rows
        self.running_width = running_width
        self.knee = knee
        self.taken: list[tuple[int, int]] = []
        self.estimates = 0

    def estimate(self, newcomers: Sequence[tuple[int, int]]) -> BatchEstimate:
        self.estimates += 1
        joined = [*self.taken, *newcomers]
        rows = self.running_rows + sum(count for count, _ in joined)
        width = max([self.running_width, *(length for _, length in joined)])
        return BatchEstimate(
            rows=rows,
            padded_tokens=rows * width,
            row_limit=self.knee,
            step_s=0.001 + 0.0002 * rows,
            encode_s=(0.0012 if joined else 0.0) + 0.00014 * sum(n * s for n, s in joined),
            place_s=0.0001 if joined else 0.0,
        )

    def take(self, newcomers: Sequence[tuple[int, int]]) -> None:
        self.taken.extend(newcomers)


def _sentence(sentence_id: int, length: int, beams: int, unit: int) -> ScheduledSentence:
    row = DecodeRequest(sentence_id, tuple(range(1, length)) + (0,), beam_size=beams)
    return ScheduledSentence(sentence_id, row, None, None, unit=unit)  # type: ignore[arg-type]


def _units(rng: random.Random) -> list[list[ScheduledSentence]]:
    units, sentence_id = [], 0
    for unit in range(rng.randint(1, 40)):
        sentences = []
        for _ in range(rng.choice([1, 1, 1, 2, 3, 6])):
            sentences.append(
                _sentence(sentence_id, rng.randint(2, 40), rng.choice([1, 1, 4]), unit)
            )
            sentence_id += 1
        units.append(sentences)
    return units


def _limits(rng: random.Random, in_line: bool) -> AdmissionLimits:
    return AdmissionLimits(
        max_rows=rng.choice([16, 32, 64]),
        max_tokens=rng.choice([300, 1000, 100_000]),
        max_encode_tokens=rng.choice([40, 120, 10_000]),
        max_stall_s=rng.choice([None, 0.004, 0.01, 0.05]),
        judge_knee=rng.random() < 0.5,
        encode_in_line=in_line,
    )


def _fill_one_by_one(
    admitter: Admitter, units: list[list[ScheduledSentence]], misses_allowed: int, max_rows: int
) -> None:
    """The scheduler's loop before runs: every unit tried alone."""
    misses = 0
    for unit in units:
        if admitter.rows >= max_rows or misses >= misses_allowed:
            break
        verdict = admitter.try_unit(unit)
        if verdict is Verdict.TAKEN:
            misses = 0
        elif verdict is Verdict.OVER_BUDGET and len(unit) == 1 and unit[0].rows == 1:
            break
        else:
            misses += 1


def _admitters(seed: int) -> tuple[Admitter, Admitter, GrowingPlan, GrowingPlan, list, int]:
    rng = random.Random(seed)
    running_rows = rng.choice([0, 0, 3, 12, 30])
    width = rng.randint(0, 30)
    knee = rng.choice([None, 8, 20, 48])
    limits = _limits(rng, in_line=rng.random() < 0.7)
    plans = GrowingPlan(running_rows, width, knee), GrowingPlan(running_rows, width, knee)
    admitters = [Admitter(plan, running_rows, limits) for plan in plans]
    return admitters[0], admitters[1], plans[0], plans[1], _units(rng), limits.max_rows


def test_a_run_takes_what_unit_by_unit_takes_until_its_first_refusal():
    verdicts_seen = set()
    for seed in range(400):
        one_by_one, in_runs, _, _, units, _ = _admitters(seed)
        expected, first_refusal = 0, None
        for unit in units:
            verdict = one_by_one.try_unit(unit)
            if verdict is not Verdict.TAKEN:
                first_refusal = verdict
                break
            expected += 1
        taken, verdict = in_runs.take_run(units)
        verdicts_seen.add(verdict)
        assert (taken, verdict) == (expected, first_refusal), seed
        assert [s.sentence_id for s in in_runs.chosen] == [s.sentence_id for s in one_by_one.chosen]
        assert in_runs.rows == one_by_one.rows
        assert in_runs.estimate == one_by_one.estimate
    assert verdicts_seen == {None, Verdict.NO_ROOM, Verdict.OVER_BUDGET}


def test_filling_in_runs_chooses_what_one_unit_at_a_time_chose():
    for seed in range(400):
        one_by_one, in_runs, _, _, units, max_rows = _admitters(seed)
        misses_allowed = random.Random(seed).choice([1, 3, 8])
        _fill_one_by_one(one_by_one, units, misses_allowed, max_rows)
        in_runs.fill(units, misses_allowed)
        assert [s.sentence_id for s in in_runs.chosen] == [
            s.sentence_id for s in one_by_one.chosen
        ], seed
        assert in_runs.estimate == one_by_one.estimate


def test_a_long_queue_that_joins_whole_costs_a_handful_of_estimates():
    limits = AdmissionLimits(
        max_rows=64,
        max_tokens=100_000,
        max_encode_tokens=10_000,
        max_stall_s=1.0,
        judge_knee=True,
        encode_in_line=True,
    )
    units = [[_sentence(index, 8, 1, index)] for index in range(40)]
    one_plan, runs_plan = GrowingPlan(10, 8, None), GrowingPlan(10, 8, None)
    _fill_one_by_one(Admitter(one_plan, 10, limits), units, 8, limits.max_rows)
    in_runs = Admitter(runs_plan, 10, limits)
    in_runs.fill(units, 8)
    assert len(in_runs.chosen) == 40
    assert one_plan.estimates == 40
    assert runs_plan.estimates <= 2 * (40).bit_length()  # runs of 1, 2, 4, ..., 32, then 40
