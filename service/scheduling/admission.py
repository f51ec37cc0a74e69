"""Who joins the running batch at a step boundary, and whether joining now beats waiting.

Three parts, each with one job:

``Admitter``
    Fills one admission, unit by unit (the sentences of one request), like SGLang's
    ``PrefillAdder``: ``try_unit`` answers ``TAKEN``, ``NO_ROOM`` (rows or padded tokens) or
    ``OVER_BUDGET`` (past this machine's knee, or more encoder work than one admission may
    stall the running rows for). It asks the engine's plan what the batch would look like;
    ``fill`` takes what ``try_unit`` over a queue would, in runs of units (``take_run``),
    in a few of those estimates.
``LatencyBudget``
    The continuous policy's judgement of a filled admission. Joining now costs the running
    rows: the stall while the newcomers are encoded (unless a spare core overlaps it) and
    merged, and a slower step for every step they share; where the encoder runs in line it
    also costs the rows left in the queue, which wait for the drain it pushes back, and with
    them the rows arriving before that drain (the batch cannot take them either). Waiting
    costs the newcomers the time until the running batch drains, when joining costs no one.
    The newcomers join when the delay summed over every row is lower that way. On one core
    with short strings the stall dominates and newcomers coalesce as under static batching;
    where steps are nearly flat in rows (a GPU) or a spare core encodes, they join at once. A
    deferral's ``Deficit`` says what must change before judging again is worth its CPU.
``OutputLengths``
    How many steps a sentence takes, learned from the ones that finished (generated tokens
    per source token), for the remaining steps of the running rows and the newcomers.

The static and continuous policies (service/scheduling/scheduler.py) decide *when* an
admission is open; these decide *who*.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from service.runtime.types import BatchEstimate
from service.scheduling.sentences import ScheduledSentence


class AdmissionTrials(Protocol):
    """The running batch on which one admission tries newcomers (``estimate``) and takes
    some (``take``): ``Engine.plan``'s ``BatchPlan`` (service/runtime/placement.py)."""

    def estimate(self, newcomers: Sequence[tuple[int, int]]) -> BatchEstimate: ...
    def take(self, newcomers: Sequence[tuple[int, int]]) -> None: ...


class Verdict(enum.Enum):
    TAKEN = "taken"
    NO_ROOM = "no room"
    OVER_BUDGET = "over budget"


@dataclass(frozen=True)
class AdmissionLimits:
    max_rows: int
    max_tokens: int  # padded tokens of the batch (rows x (past + source), summed over groups)
    # Source tokens one admission may encode on the encoder thread (a spare core).
    max_encode_tokens: int
    # Seconds one admission may stall the running rows for (encoder call in line, merge);
    # None: not bounded (static batching, or nothing is running).
    max_stall_s: float | None
    judge_knee: bool  # refuse rows past the step-cost model's knee (``row_limit``)
    encode_in_line: bool  # no spare core: the encoder call stalls the running rows


def pairs(sentences: Sequence[ScheduledSentence]) -> list[tuple[int, int]]:
    """``(rows, source length)`` of each sentence, as the engine's plan takes them."""
    return [(sentence.rows, sentence.src_len) for sentence in sentences]


class Admitter:
    """One admission between two steps, filled unit by unit."""

    def __init__(self, plan: AdmissionTrials, running_rows: int, limits: AdmissionLimits) -> None:
        self._plan = plan
        self._limits = limits
        self.running_rows = running_rows
        self.rows = running_rows
        self.chosen: list[ScheduledSentence] = []
        self.estimate: BatchEstimate | None = None  # the batch with ``chosen`` joined
        self._encode_tokens = 0
        # The last unit refused was over the stall bound: more encoder work than one admission
        # may do in line, so it never joins whole while rows are running.
        self.over_stall = False

    def stall_s(self, estimate: BatchEstimate) -> float:
        """What the admission would stall the running rows for."""
        encode_s = estimate.encode_s if self._limits.encode_in_line else 0.0
        return encode_s + estimate.place_s

    def try_unit(self, unit: Sequence[ScheduledSentence]) -> Verdict:
        verdict, estimate = self._judge(unit)
        if verdict is Verdict.TAKEN:
            self.take(unit, estimate)
        return verdict

    def fill(self, units: Sequence[Sequence[ScheduledSentence]], max_misses: int) -> None:
        """Each unit in turn joins if it fits beside those taken, until the rows are full or
        ``max_misses`` refusals in a row; tried in runs (``take_run``)."""
        misses = start = 0
        while start < len(units):
            if self.rows >= self._limits.max_rows or misses >= max_misses:
                return
            taken, verdict = self.take_run(units[start:])
            if verdict is None:
                return  # every unit left joined
            refused = units[start + taken]
            start += taken + 1
            misses = 1 if taken else misses + 1
            if verdict is Verdict.OVER_BUDGET and len(refused) == 1 and refused[0].rows == 1:
                return  # one row already passes the budget: so would every other unit

    def take_run(self, units: Sequence[Sequence[ScheduledSentence]]) -> tuple[int, Verdict | None]:
        """The longest leading run of ``units`` that joins, taken: how many units that is, and
        the verdict on the unit after it (None: all joined). What ``try_unit`` over the units
        in turn takes until its first refusal, in about 2 log2(run) estimates rather than one
        a unit: on one core the CPU that choosing costs lengthens every queue. Runs of 1, 2,
        4, ... more units are tried until one is refused, then halved until a unit alone is;
        each run that joins is taken at once, so every estimate places only the units after
        those taken. Both rely on a longer run never joining where a shorter one does not
        (rows, padded tokens, encoder time and its stall only grow as units join)."""
        if units and not self.chosen:
            # the admission's first unit is judged alone (an empty batch takes it whole, and
            # its encoder tokens are not bounded): the runs start after it
            first = self.try_unit(units[0])
            if first is not Verdict.TAKEN:
                return 0, first
            taken, after = self.take_run(units[1:])
            return taken + 1, after
        units = units[: self._fitting(units) + 1]  # a longer run has too many rows to join
        starts = [0, *itertools.accumulate(len(unit) for unit in units)]  # into ``flat``
        flat = [sentence for unit in units for sentence in unit]
        taken, size = 0, 1  # units taken; how many more to try
        refused: int | None = None  # the fewest units known not to join (from the start)
        refusal: Verdict | None = None
        while taken < (limit := len(units) if refused is None else refused - 1):
            end = min(taken + size, limit)  # ``limit``: the longest run that may still join
            run = flat[starts[taken] : starts[end]]
            verdict, estimate = self._judge(run)
            if verdict is Verdict.TAKEN:
                self.take(run, estimate)
                taken = end
                size = 2 * size if refused is None else max(1, (refused - taken) // 2)
            else:
                refused, refusal = end, verdict
                size = max(1, (end - taken) // 2)
        return taken, refusal if taken < len(units) else None

    def _fitting(self, units: Sequence[Sequence[ScheduledSentence]]) -> int:
        """How many leading ``units`` fit the rows left: no run past them can join (the one
        after them is refused for its rows without an estimate), so a long queue costs a
        choice no more than the rows left do."""
        room = self._limits.max_rows - self.rows
        for count, unit in enumerate(units):
            room -= unit[0].rows if len(unit) == 1 else sum(sentence.rows for sentence in unit)
            if room < 0:
                return count
        return len(units)

    def _judge(self, unit: Sequence[ScheduledSentence]) -> tuple[Verdict, BatchEstimate | None]:
        """Whether ``unit`` would join what is taken so far, and the batch's estimate if so."""
        limits = self._limits
        rows = sum(sentence.rows for sentence in unit)
        if self.rows + rows > limits.max_rows:
            return Verdict.NO_ROOM, None
        estimate = self._plan.estimate(pairs(unit))
        if estimate.padded_tokens > limits.max_tokens:
            return Verdict.NO_ROOM, None
        anyone_else = self.running_rows > 0 or bool(self.chosen)  # an empty batch takes the head
        if anyone_else and self._over_budget(unit, estimate):
            return Verdict.OVER_BUDGET, None
        return Verdict.TAKEN, estimate

    def _over_budget(self, unit: Sequence[ScheduledSentence], estimate: BatchEstimate) -> bool:
        limits = self._limits
        self.over_stall = False
        if (
            limits.judge_knee
            and estimate.row_limit is not None
            and estimate.rows > estimate.row_limit
        ):
            return True
        if limits.encode_in_line:
            bound = limits.max_stall_s
            self.over_stall = (
                self.running_rows > 0 and bound is not None and self.stall_s(estimate) > bound
            )
            return self.over_stall
        tokens = self._encode_tokens + sum(sentence.src_len for sentence in unit)
        return bool(self.chosen) and tokens > limits.max_encode_tokens

    def take(
        self, unit: Sequence[ScheduledSentence], estimate: BatchEstimate | None = None
    ) -> None:
        """Take ``unit`` whatever the budgets (an empty batch takes the head sentence: a
        sentence that passed the request limits must run, whatever the batch settings)."""
        estimate = estimate or self._plan.estimate(pairs(unit))
        self._plan.take(pairs(unit))
        self.chosen.extend(unit)
        self.rows += sum(sentence.rows for sentence in unit)
        self._encode_tokens += sum(sentence.src_len for sentence in unit)
        self.estimate = estimate

    def never_fits_whole(self, unit: Sequence[ScheduledSentence], knee: int | None) -> bool:
        """A unit too big to join whole even a batch of its own size: it joins sentence by
        sentence (more rows than the row budget or the knee)."""
        limit = self._limits.max_rows
        if self._limits.judge_knee and knee is not None:
            limit = min(limit, knee)
        return sum(sentence.rows for sentence in unit) > limit


class OutputLengths:
    """Steps a sentence takes, from the sentences that finished: an exponential average of
    generated tokens per source token (a translation is about as long as its source)."""

    def __init__(self, ratio: float = 1.2, weight: float = 0.05) -> None:
        self.ratio = ratio
        self._weight = weight

    def observe(self, src_len: int, steps: int) -> None:
        if src_len > 0:
            self.ratio += self._weight * (steps / src_len - self.ratio)

    def expected(self, sentence: ScheduledSentence) -> int:
        return min(sentence.row.max_new_tokens, max(1, round(self.ratio * sentence.src_len)))

    def remaining(self, sentence: ScheduledSentence, steps_done: int) -> int:
        """Steps left; a sentence past its expected length is expected to end soon."""
        left = self.expected(sentence) - steps_done
        if left <= 0:
            left = max(2, steps_done // 4)
        return max(1, min(sentence.row.max_new_tokens - steps_done, left))


@dataclass(frozen=True)
class Deficit:
    """How far a deferred admission was from joining (cost minus benefit), and the most that
    each later change can close of it: a running row leaving takes its share of the cost
    with it, a step passing shortens the steps the newcomers would share, a row arriving in
    the queue adds one more newcomer's wait to the benefit. Until their sum reaches
    ``seconds`` the same choice would defer again, so the engine loop need not make it (on
    one core a choice costs a sixth of a step, and under load most boundaries defer)."""

    seconds: float
    per_row_left_s: float
    per_step_s: float
    per_row_arrived_s: float

    def closed_by(self, rows_left: int, steps: int, rows_arrived: int) -> bool:
        closable = (
            rows_left * self.per_row_left_s
            + steps * self.per_step_s
            + rows_arrived * self.per_row_arrived_s
        )
        return closable >= self.seconds


@dataclass(frozen=True)
class RunningRow:
    rows: int  # 1 greedy, K beams
    remaining_steps: int


class LatencyBudget:
    """Join now or wait for the running batch to drain: whichever adds less delay summed over
    every row (module docstring)."""

    # A step of a few rows costs at least this share of a full one (the fixed per-call cost:
    # projections of tiny matrices, the search, Python): the drain time's floor per step.
    FIXED_SHARE = 0.3

    def deficit(
        self,
        now: BatchEstimate,
        joined: BatchEstimate,
        stall_s: float,
        running: Sequence[RunningRow],
        newcomer_rows: int,
        newcomer_steps: int,
        queued_rows: int = 0,
        arriving_rows_per_s: float = 0.0,
    ) -> Deficit | None:
        """None where the admission joins now; else how far it is from joining.
        ``queued_rows``: rows that stay queued until the batch drains (the encoder runs in
        line, so they rarely join before it): the newcomers' stall, slower steps and steps
        past the running rows' push that drain back for each of them, and for the rows
        arriving before it at ``arriving_rows_per_s`` where some stay queued (where the
        admission takes everyone queued, arrivals may join later as it did)."""
        if not running or now.step_s <= 0:
            return None  # nobody to slow down, or nothing known yet
        slower_s = max(0.0, joined.step_s - now.step_s)
        cost = sum(
            row.rows * (stall_s + slower_s * min(row.remaining_steps, newcomer_steps))
            for row in running
        )
        drain_s = self.drain_s(now.step_s, running)
        if queued_rows:
            # the stall and the newcomers' own steps push the drain back, for the rows left in
            # the queue and, as the batch cannot take them all, for those arriving before it
            with_newcomers = [*running, RunningRow(newcomer_rows, newcomer_steps)]
            later_s = max(0.0, stall_s + self.drain_s(joined.step_s, with_newcomers) - drain_s)
            cost += (queued_rows + arriving_rows_per_s * drain_s) * later_s
        benefit = newcomer_rows * drain_s
        if benefit >= cost:
            return None
        return Deficit(
            seconds=cost - benefit,
            per_row_left_s=stall_s + slower_s * newcomer_steps,
            per_step_s=slower_s * sum(row.rows for row in running),
            per_row_arrived_s=drain_s,
        )

    def drain_s(self, step_s: float, running: Sequence[RunningRow]) -> float:
        """Predicted seconds until every running row has finished: a step's time shrinks with
        the rows still in it, down to its fixed share."""
        # runs between two decoder steps: one pass over the rows, shortest first, not one per
        # step (a hundred steps of sixty-four rows)
        total_rows = sum(row.rows for row in running)
        alive, seconds, step = total_rows, 0.0, 0
        for row in sorted(running, key=lambda row: row.remaining_steps):
            while step < row.remaining_steps:  # every row left is alive at these steps
                seconds += step_s * max(alive / total_rows, self.FIXED_SHARE)
                step += 1
            alive -= row.rows
        return seconds
