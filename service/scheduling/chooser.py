"""Who joins the running batch at one step boundary: the admission, filled and judged.

The head of the queue goes first whenever it fits, so nothing starves; then units that do
not widen the batch (less padding for every row), then the others in arrival order, each
judged by the ``Admitter`` (service/scheduling/admission.py; in runs of units, with the
outcome of one unit at a time). Whole units join together; a unit that can never join whole
(more rows than the budget or the knee, or more encoder work than one in-line admission may
stall the running rows for) joins sentence by sentence. Under the continuous policy the
filled admission then faces the ``LatencyBudget``: it joins now only where that adds less
delay, summed over every row, than waiting for the batch to drain; except where the encoder
runs in line and the batch drains under load (as many rows queued as running, submissions
arriving every step or two): then the queue joins at once, in one encoder call.

``choose`` returns its whole decision as a ``Choice``: the newcomers, or why nobody joins (a
``Refusal``, with the latency budget's ``Deficit`` where it deferred them), which is what the
scheduler's ``DeferralHold`` (service/scheduling/hold.py) keeps to skip choices whose outcome
is known.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.metrics import ServiceMetrics
from service.runtime.types import BatchEstimate
from service.scheduling.admission import (
    AdmissionLimits,
    Admitter,
    Deficit,
    LatencyBudget,
    OutputLengths,
    RunningRow,
    Verdict,
)
from service.scheduling.engine_api import CostedEngine
from service.scheduling.sentences import ScheduledSentence
from service.scheduling.settings import BatchingSettings

# The knee is the most rows whose predicted tokens/s are within this fraction of the best
# row count's: the fitted step costs are good to a few percent, so a tighter bound would
# chase their noise, and a looser one would admit rows past the peak.
COST_TOLERANCE = 0.05
# An admission encoded in line (no spare core) stalls the running rows for at most this many
# of their predicted steps; a bigger one is cut into chunks between steps. A larger bound
# lets extra joins stall the long rows that set the tail latency; no bound lets the tail
# grow without limit under heavy load.
MAX_STALL_STEPS = 2.0
# Submissions per step of the running batch from which an in-line admission counts as
# crowded (``AdmissionChooser._crowded``): under a closed loop that saturates one core about
# one request returns per step; at half load one every two or three steps.
CROWD_ARRIVALS_PER_STEP = 0.5
# Units that may be tried in a row without one fitting before admission stops looking:
# admission runs between two steps, so its scan of a long queue must stay short.
MAX_ADMISSION_MISSES = 8


class Refusal(enum.Enum):
    """Why a choice took nobody, which says what must change before choosing again can take
    someone (``DeferralHold``, service/scheduling/hold.py)."""

    # only background units are queued, and they wait beside interactive rows: until the
    # batch or the queue changes
    BACKGROUND = "background"
    # the head of the queue cannot join, and nobody joins before it: until the batch or the
    # head changes (nothing arriving behind it changes that)
    HEAD = "head"
    # ... because its first sentence alone would stall the running rows past the bound: rows
    # leaving only shorten the step the bound counts in, so only a row joining (a longer
    # step), a new head or an empty batch can let it in
    HEAD_OVER_STALL = "head over the stall bound"
    # the latency budget: joining now costs more delay than waiting for the drain, by the
    # choice's ``deficit``
    BUDGET = "budget"


@dataclass(frozen=True)
class Choice:
    """One choice at a step boundary, whole: the newcomers that join, or why nobody does."""

    newcomers: tuple[ScheduledSentence, ...] = ()
    refusal: Refusal | None = None  # None: the newcomers join
    deficit: Deficit | None = None  # ``Refusal.BUDGET``: how far the admission was from joining

    def __post_init__(self) -> None:
        if bool(self.newcomers) == (self.refusal is not None):
            raise ValueError("a choice takes newcomers or says why it takes none, not both")
        if (self.deficit is not None) != (self.refusal is Refusal.BUDGET):
            raise ValueError("a deficit goes with a deferral by the latency budget, alone")

    @classmethod
    def take(cls, newcomers: Sequence[ScheduledSentence]) -> Choice:
        return cls(tuple(newcomers))

    @classmethod
    def defer(cls, refusal: Refusal, deficit: Deficit | None = None) -> Choice:
        return cls(refusal=refusal, deficit=deficit)

    @property
    def took(self) -> bool:
        return self.refusal is None


class AdmissionChooser:
    """Chooses each admission (engine thread only); keeps no verdict of its own: each
    ``choose`` returns the whole ``Choice``."""

    def __init__(
        self,
        engine: CostedEngine,
        config: BatchingSettings,
        *,
        judges_cost: bool,
        encode_in_line: bool,
        metrics: ServiceMetrics,
        clock: Callable[[], float],
    ) -> None:
        """``clock``: the queue's (``ScheduledSentence.enqueued_at`` is read on it)."""
        self.engine = engine
        self.config = config
        self.judges_cost = judges_cost
        self.encode_in_line = encode_in_line
        self.metrics = metrics
        self._clock = clock
        self.budget = LatencyBudget()
        self.lengths = OutputLengths()
        self._step_s = 0.0  # the running batch's predicted step, at the last choice

    def choose(
        self,
        units: list[list[ScheduledSentence]],
        staying: list[ScheduledSentence],
        row_rate: float = 0.0,
    ) -> Choice:
        """Who of ``units`` (queued, by unit, in arrival order) joins the ``staying`` running
        sentences at this boundary, or why nobody does (a deferral). ``row_rate``: rows
        arriving per second, who may wait for the drain a join pushes back."""
        units = self._by_priority(units, staying)
        choice = self._fill(units, staying, row_rate) if units else Choice.defer(Refusal.BACKGROUND)
        if not choice.took:
            self.metrics.admission_deferrals.inc()
        return choice

    def _by_priority(
        self, units: list[list[ScheduledSentence]], staying: list[ScheduledSentence]
    ) -> list[list[ScheduledSentence]]:
        """Interactive units first; background units (document jobs) only where no interactive
        one waits or runs (or the oldest has waited ``background_max_wait_s``), and only while
        the batch holds at most ``background_max_rows`` of their rows (the first one whatever
        its size where none runs, so a big paragraph still runs)."""
        interactive = [unit for unit in units if not unit[0].background]
        if interactive:
            return interactive
        # Beside running interactive rows a background unit waits, up to background_max_wait_s,
        # for a step boundary with none: a document uses the engine's spare steps, and under a
        # steady interactive load it still moves a unit at a time.
        serving = any(not s.background for s in staying)
        if serving and self._clock() - units[0][0].enqueued_at < self.config.background_max_wait_s:
            return []
        room = self.config.background_max_rows - sum(s.rows for s in staying if s.background)
        allowed: list[list[ScheduledSentence]] = []
        for unit in units:
            rows = sum(s.rows for s in unit)
            if rows > room and (allowed or room < self.config.background_max_rows):
                break
            allowed.append(unit)
            room -= rows
        return allowed

    def _fill(
        self,
        units: list[list[ScheduledSentence]],
        staying: list[ScheduledSentence],
        row_rate: float,
    ) -> Choice:
        running_rows = sum(s.rows for s in staying)
        plan = self.engine.plan(self.config.max_batch_rows, COST_TOLERANCE)
        now = plan.estimate(())  # the batch as it is: nothing taken yet
        self._step_s = now.step_s
        judges_cost = self.judges_cost
        crowded = judges_cost and self._crowded(units, running_rows, row_rate, now.step_s)
        bounded = judges_cost and now.step_s and not crowded
        limits = AdmissionLimits(
            max_rows=self.config.max_batch_rows,
            max_tokens=self.config.max_batch_tokens,
            max_encode_tokens=self.config.admission_max_tokens,
            max_stall_s=MAX_STALL_STEPS * now.step_s if bounded else None,
            judge_knee=judges_cost,
            encode_in_line=self.encode_in_line,
        )
        admitter = Admitter(plan, running_rows, limits)
        head, *others = units
        if admitter.try_unit(head) is not Verdict.TAKEN:
            if not staying:
                admitter.take(head[:1])
            too_big = admitter.over_stall or admitter.never_fits_whole(head, now.row_limit)
            if not admitter.chosen and not too_big:
                return Choice.defer(Refusal.HEAD)
            for sentence in head[len(admitter.chosen) :]:  # sentence by sentence
                if (verdict := admitter.try_unit([sentence])) is not Verdict.TAKEN:
                    break
            if not admitter.chosen:
                over_stall = verdict is Verdict.OVER_BUDGET and admitter.over_stall
                return Choice.defer(Refusal.HEAD_OVER_STALL if over_stall else Refusal.HEAD)
        width = max((s.src_len for s in staying + admitter.chosen), default=0)
        admitter.fill(_narrow_first(others, width), MAX_ADMISSION_MISSES)
        # a crowd that joins as many rows as run skips the budget; a smaller admission (the
        # knee leaves room for a few) still faces it
        newcomer_rows = sum(s.rows for s in admitter.chosen)
        if judges_cost and staying and not (crowded and newcomer_rows >= running_rows):
            deficit = self._deficit(admitter, now, staying, units, row_rate)
            if deficit is not None:
                return Choice.defer(Refusal.BUDGET, deficit)
        return Choice.take(admitter.chosen)

    def may_be_crowded(self, queued_rows: int, running_rows: int, row_rate: float) -> bool:
        """Whether a choice now may find a crowd (``_crowded``, by the queue's length and the
        last choice's step): the scheduler then chooses whatever the last deferral was."""
        return (
            self.judges_cost
            and self.encode_in_line
            and 0 < running_rows <= queued_rows
            and row_rate * self._step_s >= CROWD_ARRIVALS_PER_STEP
        )

    def _crowded(
        self,
        units: list[list[ScheduledSentence]],
        running_rows: int,
        row_rate: float,
        step_s: float,
    ) -> bool:
        """Whether the running batch is draining under load on one core: at least as many
        interactive rows wait as run, and submissions keep coming (at least
        ``CROWD_ARRIVALS_PER_STEP`` a step). Then they join now, in one encoder call,
        without the stall bound, and without the latency budget where as many join as run:
        waiting for the drain would run its steps with a few rows while the rest wait
        (measured, 32 closed-loop clients on one core: steps of 1 to 5 rows with 15 to 30
        queued, 11 rows a step on average), and the stall is borne by fewer rows than it
        lets in. With a spare core newcomers are encoded beside the steps, and the budget
        already lets them in."""
        if not (self.encode_in_line and running_rows and step_s > 0) or units[0][0].background:
            return False
        if row_rate * step_s < CROWD_ARRIVALS_PER_STEP:
            return False
        queued = 0
        for unit in units:
            queued += sum(s.rows for s in unit)
            if queued >= running_rows:
                return True
        return False

    def _deficit(
        self,
        admitter: Admitter,
        now: BatchEstimate,
        staying: list[ScheduledSentence],
        units: list[list[ScheduledSentence]],
        row_rate: float,
    ) -> Deficit | None:
        """None where the filled admission joins now; else how far it is from joining."""
        joined = admitter.estimate
        if joined is None:
            return None
        steps = self.engine.steps
        running = [
            RunningRow(s.rows, self.lengths.remaining(s, steps - s.admitted_step)) for s in staying
        ]
        return self.budget.deficit(
            now,
            joined,
            admitter.stall_s(joined),
            running,
            newcomer_rows=(newcomer_rows := sum(s.rows for s in admitter.chosen)),
            newcomer_steps=max(self.lengths.expected(s) for s in admitter.chosen),
            # where the encoder runs in line the rest of the queue waits for the drain, and
            # so do the rows arriving before it
            queued_rows=sum(s.rows for unit in units for s in unit) - newcomer_rows
            if self.encode_in_line
            else 0,
            arriving_rows_per_s=row_rate if self.encode_in_line else 0.0,
        )


def _narrow_first(
    units: list[list[ScheduledSentence]], width: int
) -> list[list[ScheduledSentence]]:
    """The units no wider than ``width`` source tokens, then the others, each in arrival order
    (one pass: the window holds a few hundred units under load, and this runs every choice)."""
    narrow: list[list[ScheduledSentence]] = []
    wide: list[list[ScheduledSentence]] = []
    for unit in units:
        widest = unit[0].src_len if len(unit) == 1 else max(s.src_len for s in unit)
        (wide if widest > width else narrow).append(unit)
    return narrow + wide
