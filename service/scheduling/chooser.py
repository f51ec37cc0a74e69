"""Who joins the running batch at one step boundary: the admission, filled and judged; and
whether choosing again would only defer again.

The head of the queue goes first whenever it fits, so nothing starves; then units that do
not widen the batch (less padding for every row), then the others in arrival order, each
judged by the ``Admitter`` (service/scheduling/admission.py; in runs of units, with the
outcome of one unit at a time). Whole units join together; a unit that can never join whole
(more rows than the budget or the knee, or more encoder work than one in-line admission may
stall the running rows for) joins sentence by sentence. Under the continuous policy the
filled admission then faces the ``LatencyBudget``: it joins now only where that adds less
delay, summed over every row, than waiting for the batch to drain.

On one core a choice costs a sizeable part of a step, and under load most step boundaries
defer every queued unit. ``DeferralHold`` keeps what the last deferral depended on, so the
scheduler (service/scheduling/scheduler.py) skips choices whose outcome is known:

- deferred by the latency budget: until the rows that left, the steps taken and the rows that
  arrived since could have closed its ``Deficit``, or a row joined;
- the head of the queue refused over the stall bound: until a row joins or the head changes
  (rows leaving make steps faster and only tighten the bound; an empty batch takes the head
  whatever it costs, and the scheduler chooses whenever nothing runs);
- the head refused for anything else: until the batch or the head changes (nothing arriving
  behind it changes that);
- any other deferral: until the batch or the queue changes;

and never for more than ``RECHECK_STEPS`` steps (background units age; the output-length
estimates move).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Protocol

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


class AdmissionChooser:
    """Chooses each admission (engine thread only)."""

    # Units that may be tried in a row without one fitting before admission stops looking:
    # admission runs between two steps, so its scan of a long queue must stay short.
    MAX_ADMISSION_MISSES = 8

    def __init__(
        self,
        engine: CostedEngine,
        config: BatchingSettings,
        *,
        judges_cost: bool,
        encode_in_line: bool,
        metrics: ServiceMetrics,
        cost_tolerance: float = COST_TOLERANCE,
        max_stall_steps: float = MAX_STALL_STEPS,
    ) -> None:
        self.engine = engine
        self.config = config
        self.cost_tolerance = cost_tolerance
        self.max_stall_steps = max_stall_steps
        self.judges_cost = judges_cost
        self.encode_in_line = encode_in_line
        self.metrics = metrics
        self.budget = LatencyBudget()
        self.lengths = OutputLengths()
        # The last choice deferred because the head of the queue could not join: nobody
        # joins before it, whatever arrives behind it.
        self.head_refused = False
        # ... because its first sentence alone would stall the running rows past the bound:
        # rows leaving only shorten the step the bound counts in, so only a row joining (a
        # longer step), a new head or an empty batch can let it in.
        self.head_over_stall = False
        # The last choice deferred by the latency budget: how far it was from joining.
        self.deficit: Deficit | None = None

    def choose(
        self,
        units: list[list[ScheduledSentence]],
        staying: list[ScheduledSentence],
        row_rate: float = 0.0,
    ) -> list[ScheduledSentence]:
        """The sentences of ``units`` (queued, by unit, in arrival order) that join the
        ``staying`` running sentences at this boundary; [] when none does (a deferral).
        ``row_rate``: rows arriving per second, who may wait for the drain a join pushes back."""
        units = self._by_priority(units, staying)
        self.head_refused = self.head_over_stall = False
        self.deficit = None
        chosen = self._fill(units, staying, row_rate) if units else []
        if not chosen:
            self.metrics.admission_deferrals.inc()
        return chosen

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
        if (
            serving
            and time.monotonic() - units[0][0].enqueued_at < self.config.background_max_wait_s
        ):
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
    ) -> list[ScheduledSentence]:
        running_rows = sum(s.rows for s in staying)
        plan = self.engine.plan(self.config.max_batch_rows, self.cost_tolerance)
        now = plan.estimate(())  # the batch as it is: nothing taken yet
        judges_cost = self.judges_cost
        limits = AdmissionLimits(
            max_rows=self.config.max_batch_rows,
            max_tokens=self.config.max_batch_tokens,
            max_encode_tokens=self.config.admission_max_tokens,
            max_stall_s=self.max_stall_steps * now.step_s if judges_cost and now.step_s else None,
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
                self.head_refused = True
                return []
            for sentence in head[len(admitter.chosen) :]:  # sentence by sentence
                if (verdict := admitter.try_unit([sentence])) is not Verdict.TAKEN:
                    break
            if not admitter.chosen:
                self.head_refused = True
                self.head_over_stall = verdict is Verdict.OVER_BUDGET and admitter.over_stall
                return []
        width = max((s.src_len for s in staying + admitter.chosen), default=0)
        admitter.fill(_narrow_first(others, width), self.MAX_ADMISSION_MISSES)
        if judges_cost and staying and not self._joins_now(admitter, now, staying, units, row_rate):
            return []
        return admitter.chosen

    def _joins_now(
        self,
        admitter: Admitter,
        now: BatchEstimate,
        staying: list[ScheduledSentence],
        units: list[list[ScheduledSentence]],
        row_rate: float,
    ) -> bool:
        joined = admitter.estimate
        if joined is None:
            return True
        steps = self.engine.steps
        running = [
            RunningRow(s.rows, self.lengths.remaining(s, steps - s.admitted_step)) for s in staying
        ]
        self.deficit = self.budget.deficit(
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
        return self.deficit is None


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


class QueueState(Protocol):
    """What the hold reads of the queue (``SentenceQueue``, under its ``cond``)."""

    version: int  # grows with every arrival and withdrawal
    arrived_rows: int  # rows ever queued

    def head_unit(self) -> int | None: ...


@dataclass
class BatchChanges:
    """Running counts of what changed the running batch (engine thread)."""

    version: int = 0  # grows whenever a sentence joins or leaves the batch
    rows_left: int = 0  # rows that ever left it (finished or dropped)
    rows_joined: int = 0  # rows that ever joined it

    def joined(self, rows: int) -> None:
        self.version += 1
        self.rows_joined += rows

    def left(self, rows: int) -> None:
        self.version += 1
        self.rows_left += rows


@dataclass(frozen=True)
class Deferral:
    """What a choice that deferred every queued unit depended on."""

    queue: int | None  # the queue's version, or its head unit where the head was refused
    head_refused: bool
    head_over_stall: bool  # the head was refused over the stall bound (``AdmissionChooser``)
    batch: BatchChanges  # the batch's counts then (a copy)
    step: int
    deficit: Deficit | None  # deferred by the latency budget: how far from joining
    arrived_rows: int  # ``SentenceQueue.arrived_rows`` then


class DeferralHold:
    """The last choice, where it deferred everyone, and whether it still holds."""

    RECHECK_STEPS = 16

    def __init__(self, batch: BatchChanges) -> None:
        self._batch = batch
        self._last: Deferral | None = None

    def record(
        self,
        queue: int | None,
        *,
        head_refused: bool,
        head_over_stall: bool,
        step: int,
        deficit: Deficit | None,
        arrived_rows: int,
    ) -> None:
        """A choice deferred every queued unit (``queue``: the queue's version, or its head
        unit where the head was refused)."""
        self._last = Deferral(
            queue, head_refused, head_over_stall, replace(self._batch), step, deficit, arrived_rows
        )

    def clear(self) -> None:
        """A choice took someone: nothing holds."""
        self._last = None

    def holds(self, step: int, queue: QueueState) -> bool:
        """Whether choosing again at ``step`` would defer again (module docstring; the caller
        holds the queue's ``cond`` and has rows running)."""
        deferred, batch = self._last, self._batch
        if deferred is None or step - deferred.step >= self.RECHECK_STEPS:
            return False
        then = deferred.batch
        if deferred.deficit is not None and not deferred.head_refused:
            return batch.rows_joined == then.rows_joined and not deferred.deficit.closed_by(
                batch.rows_left - then.rows_left,
                step - deferred.step,
                queue.arrived_rows - deferred.arrived_rows,
            )
        if deferred.head_over_stall:
            return batch.rows_joined == then.rows_joined and deferred.queue == queue.head_unit()
        if batch.version != then.version:
            return False
        return deferred.queue == (queue.head_unit() if deferred.head_refused else queue.version)
