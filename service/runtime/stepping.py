"""A group's searches advanced by one decoder output, all at once.

Every request of a group occupies contiguous rows (1 greedy, K beams; a beam search's first
step runs one row, whose cache its K beams then share). One step reads the search head's
output for all rows and returns, for all rows of the next step, the token each feeds next
and the row whose cache it continues; the group (service/runtime/groups.py) then keeps the
rows of the requests that did not finish. Greedy rows that follow the head take its best id from
one list, and the beam searches of a beam size step together (``advance_beams``): a row's
share of the host's work is what bounds a step where the decoder call is cheap (a small
model on a CPU, any model on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.runtime.model_io import StepOutput
from service.runtime.search import BeamSearch, GreedySearch, advance_beams
from service.runtime.types import DecodeRequest, FinishedRequest


@dataclass
class ActiveRequest:
    """A request in a group: its search and its source length."""

    request: DecodeRequest
    search: GreedySearch | BeamSearch
    src_len: int
    steps: int = 0  # decoder steps so far = position of the next input token
    # Beam k's row within the request's rows: beams live where their caches cost the fewest
    # copies (``place_children``), not in beam order. None: in order (greedy, a new request).
    beam_rows: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return self.search.num_rows


@dataclass
class SearchStep:
    """What one step of a group's searches decided, over the next step's rows (a beam
    search's first step turns its one row into K)."""

    finished: list[FinishedRequest]
    remaining: list[ActiveRequest]
    next_tokens: np.ndarray  # (rows,) int64: each row's next input
    parent_rows: np.ndarray  # (rows,) int64: the step's row whose cache each row continues
    kept_rows: np.ndarray | None  # (rows,) bool: rows of the remaining requests (None: all)
    reordered: bool  # some beam continues another row's cache
    # (rows,) int64: a row of the step of each row's own request, in order (its source and
    # cross keys/values); None: the rows are the step's rows (no beam search expanded).
    own_rows: np.ndarray | None = None


def advance_searches(requests: list[ActiveRequest], head: StepOutput) -> SearchStep:
    """Every search of ``requests`` (in row order) advances by ``head``."""
    best = head.top_ids[:, 0].astype(np.int64)  # a copy: greedy rows that follow it
    best_ids = best.tolist()
    counts = [active.num_rows for active in requests]  # rows of this step
    firsts = np.cumsum([0, *counts[:-1]], dtype=np.int64)
    beam_groups: dict[int, tuple[list[ActiveRequest], list[int]]] = {}
    for index, active in enumerate(requests):
        search, first = active.search, int(firsts[index])
        if isinstance(search, BeamSearch):
            actives, indices = beam_groups.setdefault(search.beam_size, ([], []))
            actives.append(active)
            indices.append(index)
        elif search.follows_head():
            search.take(best_ids[first])
        else:
            best[first] = search.advance(head.rows(first, first + 1))[0][0]
        active.steps += 1
    # Rows of the next step: a beam search has K once it has stepped (it steps below).
    new_counts = [
        active.search.beam_size if isinstance(active.search, BeamSearch) else count
        for active, count in zip(requests, counts, strict=True)
    ]
    rows = sum(new_counts)
    own_rows: np.ndarray | None = None
    if new_counts == counts:
        next_tokens, parent_rows, new_firsts = best, np.arange(rows), firsts
    else:  # beam searches took their first step: their row becomes K
        new_firsts = np.cumsum([0, *new_counts[:-1]], dtype=np.int64)
        same = np.repeat(np.array(new_counts) == np.array(counts), new_counts)
        within = np.arange(rows) - np.repeat(new_firsts, new_counts)
        own_rows = np.repeat(firsts, new_counts) + np.where(same, within, 0)
        next_tokens, parent_rows = best[own_rows], own_rows.copy()
    for beams, (actives, indices) in beam_groups.items():
        places = np.stack([_beam_rows(active, beams) for active in actives])  # (R, K)
        step_firsts, next_firsts = firsts[indices][:, None], new_firsts[indices][:, None]
        searches = [active.search for active in actives if isinstance(active.search, BeamSearch)]
        tokens, parents = advance_beams(searches, head, step_firsts + places)
        sources = np.take_along_axis(places, parents, axis=1)  # each next beam's parent's row
        targets = place_children(sources)
        for active, target in zip(actives, targets, strict=True):
            active.beam_rows = target
        next_tokens[next_firsts + targets] = tokens
        parent_rows[next_firsts + targets] = step_firsts + sources
    reordered = bool(beam_groups) and bool(
        (parent_rows != (np.arange(rows) if own_rows is None else own_rows)).any()
    )
    finished: list[FinishedRequest] = []
    remaining: list[ActiveRequest] = []
    kept = [not active.search.done for active in requests]
    for active, keep in zip(requests, kept, strict=True):
        if keep:
            remaining.append(active)
        else:
            search = active.search
            finished.append(
                FinishedRequest(
                    active.request.request_id, search.result(), active.steps, search.hypotheses()
                )
            )
    kept_rows = np.repeat(kept, new_counts) if finished else None
    return SearchStep(finished, remaining, next_tokens, parent_rows, kept_rows, reordered, own_rows)


def _beam_rows(active: ActiveRequest, beams: int) -> np.ndarray:
    """Beam k's row within the request's rows of this step: all the first row before the
    first step (``BeamSearch.num_rows``)."""
    if active.num_rows == 1:
        return np.zeros(beams, dtype=np.int64)
    return np.arange(beams) if active.beam_rows is None else active.beam_rows


def place_children(sources: np.ndarray) -> np.ndarray:
    """The rows (within each request) of the next beams, whose parents sit in rows
    ``sources`` (R, K): a parent's first child stays in its parent's row (its cache is
    already there), the other children take the rows of beams that left no child, which a
    cache copy fills. The fewest copies a step can make: one per beam that died."""
    beams = sources.shape[1]
    placed = []
    for parents in sources.tolist():
        taken: set[int] = set()
        rows = []
        for parent in parents:
            rows.append(-1 if parent in taken else parent)
            taken.add(parent)
        free = iter(row for row in range(beams) if row not in taken)
        placed.append([row if row >= 0 else next(free) for row in rows])
    return np.array(placed, dtype=np.int64)
