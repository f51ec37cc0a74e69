"""Where newcomers go among the running groups, and which groups merge.

Rows that joined at about the same time *and* have sources of about the same length share one
dense batch (one decoder call per group and step). A newcomer is then padded neither to the past
length of a row that has decoded for a hundred steps nor to a paragraph's source: a UI string
never attends over a paragraph's padding. Newcomers are split into length classes (each
encoded in the calls that cost least, ``encoder_calls``) and each class joins a group of its
age and length, or opens one (at most ``max_groups``; beyond that, the group it pads least);
groups whose pasts and lengths come close merge.

With a fitted step-cost model (service/runtime/step_cost.py) both decisions are by predicted
time: a newcomer joins whichever group adds least to the step (another decoder call's fixed
overhead against padding an existing group), and two groups merge when one call costs less
than two. Before the model is fitted, by the length and age rules above.

The rules see groups only as ``GroupSpan`` (shape and shortest source): the engine hands them
in, so a plan can place hypothetical newcomers without touching a tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from service.runtime.groups import GroupSpan
from service.runtime.step_cost import AdmissionPricing, EncodePrices, StepCostModel, StepShape
from service.runtime.types import BatchEstimate

T = TypeVar("T")


def similar_lengths(shortest: int, longest: int, slack: int) -> bool:
    """Sources that may share a padded batch: the padding stays below about half of it."""
    return longest - shortest <= max(slack, shortest)


def length_classes(items: Iterable[T], length: Callable[[T], int], slack: int) -> list[list[T]]:
    """``items`` sorted by ``length`` and cut where lengths stop being similar to the shortest
    of their class: the encoder calls ``Engine.encode`` makes, one per class, and what the
    admission plan prices."""
    classes: list[list[T]] = []
    for item in sorted(items, key=length):
        if classes and similar_lengths(length(classes[-1][0]), length(item), slack):
            classes[-1].append(item)
        else:
            classes.append([item])
    return classes


def encoder_calls(
    length_class: list[T], length: Callable[[T], int], prices: EncodePrices | None
) -> list[list[T]]:
    """One length class (sorted by ``length``) cut into the encoder calls that cost least by
    ``prices``: runs of neighbouring lengths, each padded to its longest.

    A class may pad its shortest source to twice its length (``similar_lengths``), and the
    encoder's work is linear in padded tokens: one call for a class of UI strings computed
    1.5-1.7x the real tokens. A further call costs its fixed overhead and saves the padding
    of the rows below the cut, so the cut follows the fitted prices (a dynamic programme over
    the class's distinct lengths, a few dozen at most). Without prices: one call."""
    if prices is None or len(length_class) < 2:
        return [length_class]
    # ends[k]: one past the last item of the k-th distinct length; starts[k] where it begins
    ends = [
        index + 1
        for index in range(len(length_class))
        if index + 1 == len(length_class)
        or length(length_class[index + 1]) != length(length_class[index])
    ]
    starts = [0, *ends]
    least = [0.0] * (len(ends) + 1)  # least[j]: seconds of the items before ends[j - 1]
    cut_at = [0] * (len(ends) + 1)
    for j, end in enumerate(ends, 1):
        per_row = prices.per_row(length(length_class[end - 1]))
        best, best_start = least[0] + end * per_row, 0
        for i in range(1, j):
            seconds = least[i] + (end - starts[i]) * per_row
            if seconds < best:
                best, best_start = seconds, i
        least[j], cut_at[j] = best + prices.per_call, best_start
    calls: list[list[T]] = []
    j = len(ends)
    while j:
        calls.append(length_class[starts[cut_at[j]] : ends[j - 1]])
        j = cut_at[j]
    return calls[::-1]


@dataclass
class PlacementRules:
    """``max_groups`` = 1: one batch for everyone. Newcomers join a group whose past is at most
    ``merge_past`` and whose sources are of similar length (``similar_lengths`` with
    ``length_slack``); groups that come that close merge."""

    step_cost: StepCostModel
    max_groups: int = 4
    merge_past: int = 8
    length_slack: int = 8

    def join_target(
        self, spans: Sequence[GroupSpan], shortest: int, longest: int, rows: int, groups: int
    ) -> int | None:
        """The index in ``spans`` of the group ``rows`` newcomers with sources of
        ``shortest..longest`` tokens join, or None (they open a group of their own);
        ``groups``: how many groups exist, counting ones newcomers would open."""
        if not spans:
            return None
        if self.step_cost.fitted:
            return self._cheapest(spans, rows, longest, groups)
        for index, span in enumerate(spans):
            if span.shape.past_len <= self.merge_past and similar_lengths(
                min(span.shortest, shortest), max(span.shape.width, longest), self.length_slack
            ):
                return index
        if groups < self.max_groups:
            return None

        # No group fits and no room for another: the one that grows least in padded tokens.
        def added_padding(index: int) -> int:
            shape = spans[index].shape
            width = max(shape.width, longest)
            return shape.rows * (width - shape.width) + width - shortest + shape.past_len

        return min(range(len(spans)), key=added_padding)

    def _cheapest(
        self, spans: Sequence[GroupSpan], rows: int, width: int, groups: int
    ) -> int | None:
        predict = self.step_cost.predict
        best: int | None = None
        best_cost = predict(StepShape(rows, 0, width)) if groups < self.max_groups else None
        for index, span in enumerate(spans):
            shape = span.shape
            joined = StepShape(shape.rows + rows, shape.past_len, max(shape.width, width))
            cost = predict(joined) - predict(shape)
            if best_cost is None or cost < best_cost:
                best, best_cost = index, cost
        return best

    def worth_merging(self, first: GroupSpan, second: GroupSpan) -> bool:
        """One decoder call for both costs less than two (by the step-cost model once it is
        fitted; before, when pasts and source lengths are close)."""
        a, b = first.shape, second.shape
        if self.step_cost.fitted:
            merged = StepShape(a.rows + b.rows, max(a.past_len, b.past_len), max(a.width, b.width))
            predict = self.step_cost.predict
            return predict(merged) <= predict(a) + predict(b)
        return abs(a.past_len - b.past_len) <= self.merge_past and similar_lengths(
            min(first.shortest, second.shortest), max(a.width, b.width), self.length_slack
        )


class Placement:
    """The groups' shapes once newcomers ``(rows, src_len)`` are placed as the engine would
    place them, and the groups they would open; nothing moves."""

    def __init__(self, rules: PlacementRules, spans: Sequence[GroupSpan]) -> None:
        self.rules = rules
        self.spans = list(spans)
        self.opened: list[GroupSpan] = []  # groups the newcomers would open (past 0)

    def copy(self) -> Placement:
        trial = Placement(self.rules, self.spans)
        trial.opened = list(self.opened)
        return trial

    def place(self, rows: int, src_len: int) -> None:
        groups = len(self.spans) + len(self.opened)
        target = self.rules.join_target(self.spans, src_len, src_len, rows, groups)
        if target is not None:
            self.spans[target] = _joined(self.spans[target], rows, src_len)
            return
        for index, opened in enumerate(self.opened):
            if similar_lengths(
                min(opened.shortest, src_len),
                max(opened.shape.width, src_len),
                self.rules.length_slack,
            ):
                self.opened[index] = _joined(opened, rows, src_len)
                return
        self.opened.append(GroupSpan(StepShape(rows, 0, src_len), src_len))

    def shapes(self) -> list[StepShape]:
        return [span.shape for span in self.spans] + [span.shape for span in self.opened]


class BatchPlan:
    """The running batch as the batcher fills it at one step (``Engine.plan``): newcomers
    ``(rows, src_len)`` placed as the engine would place them, and priced by the engine's cost
    models (``AdmissionPricing``). Each try costs O(groups), however many were taken before,
    so admission between two steps stays linear in the queue."""

    def __init__(
        self,
        placement: Placement,
        pricing: AdmissionPricing,
        length_slack: int,
        encode_prices: EncodePrices | None,
    ) -> None:
        self._placement = placement
        self._pricing = pricing
        self._length_slack = length_slack
        self._encode_prices = encode_prices
        self._taken: list[tuple[int, int]] = []
        # the running groups before any newcomer
        self._before = [span.shape for span in placement.spans]
        self._cuts: dict[tuple[int, ...], list[list[int]]] = {}
        # The last estimate's newcomers and placement: taking just those adopts it.
        self._trial: tuple[list[tuple[int, int]], Placement] | None = None

    def estimate(self, newcomers: Sequence[tuple[int, int]]) -> BatchEstimate:
        """The batch with what was taken so far and ``newcomers`` too."""
        trial = self._placement.copy()
        for rows, src_len in newcomers:
            trial.place(rows, src_len)
        self._trial = (list(newcomers), trial)
        return self._pricing.estimate(
            self._before,
            [span.shape for span in trial.spans],
            [span.shape for span in trial.opened],
            self._encoder_calls([*self._taken, *newcomers]),
        )

    def take(self, newcomers: Sequence[tuple[int, int]]) -> None:
        if self._trial is not None and self._trial[0] == list(newcomers):
            self._placement = self._trial[1]  # placed already, by the estimate just made
        else:
            for rows, src_len in newcomers:
                self._placement.place(rows, src_len)
        self._trial = None
        self._taken.extend(newcomers)

    def _encoder_calls(self, newcomers: list[tuple[int, int]]) -> list[list[int]]:
        """Encoder calls as ``Engine.encode`` makes them, as their source lengths: each length
        class cut by ``encoder_calls``, every call over its sentences padded to its longest."""
        sources = [length for _, length in newcomers]
        return [
            call
            for length_class in length_classes(sources, _itself, self._length_slack)
            for call in self._cut(tuple(length_class))
        ]

    def _cut(self, length_class: tuple[int, ...]) -> list[list[int]]:
        """``encoder_calls`` of a class, cut once per plan: the estimates of one choice share
        all classes but the one a candidate joins."""
        calls = self._cuts.get(length_class)
        if calls is None:
            calls = encoder_calls(list(length_class), _itself, self._encode_prices)
            self._cuts[length_class] = calls
        return calls


def _joined(span: GroupSpan, rows: int, src_len: int) -> GroupSpan:
    shape = span.shape
    return GroupSpan(
        StepShape(shape.rows + rows, shape.past_len, max(shape.width, src_len)),
        min(span.shortest, src_len),
    )


def _itself(length: int) -> int:
    return length
