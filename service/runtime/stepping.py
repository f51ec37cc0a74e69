"""A group's searches advanced by one decoder output, all at once.

Every request of a group occupies contiguous rows (1 greedy, K beams). One step reads the
search head's output for all rows and returns, for all rows, the token each feeds next and
the row whose cache it continues; the group (service/runtime/groups.py) then keeps the rows
of the requests that did not finish. Greedy rows that follow the head take its best id from
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

    @property
    def num_rows(self) -> int:
        return self.search.num_rows


@dataclass
class SearchStep:
    """What one step of a group's searches decided, over the step's rows."""

    finished: list[FinishedRequest]
    remaining: list[ActiveRequest]
    next_tokens: np.ndarray  # (rows,) int64: each row's next input
    parent_rows: np.ndarray  # (rows,) int64: the row whose cache each row continues
    kept_rows: np.ndarray  # (rows,) bool: rows of the remaining requests
    reordered: bool  # some beam continues another row's cache


def advance_searches(requests: list[ActiveRequest], head: StepOutput) -> SearchStep:
    """Every search of ``requests`` (in row order) advances by ``head``."""
    next_tokens = head.top_ids[:, 0].astype(np.int64)  # a copy: greedy rows that follow it
    best_ids = next_tokens.tolist()
    beam_groups: dict[int, tuple[list[BeamSearch], list[int]]] = {}
    offset = 0
    for active in requests:
        search = active.search
        if isinstance(search, BeamSearch):
            searches, firsts = beam_groups.setdefault(search.num_rows, ([], []))
            searches.append(search)
            firsts.append(offset)
        elif search.follows_head():
            search.take(best_ids[offset])
        else:
            next_tokens[offset] = search.advance(head.rows(offset, offset + 1))[0][0]
        active.steps += 1
        offset += search.num_rows
    parent_rows = np.arange(offset)
    reordered = False
    for beams, (searches, firsts) in beam_groups.items():
        tokens, parents = advance_beams(searches, head, firsts)
        rows = np.asarray(firsts)[:, None] + np.arange(beams)  # (R, K)
        next_tokens[rows] = tokens
        parent_rows[rows] = rows[:, :1] + parents
        reordered = reordered or bool((parents != np.arange(beams)).any())
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
    kept_rows = np.repeat(kept, [active.num_rows for active in requests]) if finished else None
    return SearchStep(
        finished,
        remaining,
        next_tokens,
        parent_rows,
        np.ones(offset, dtype=bool) if kept_rows is None else kept_rows,
        reordered,
    )
