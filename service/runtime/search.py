"""Per-request search state: one small object per request, numpy only.

The decoder graph ends in a search head (export/search_head.py): per row it returns the k best
log-probabilities and their ids (bans applied) and the log-probabilities, before the bans, of
a few watched ids. The searches here never see the vocabulary-wide logits: beam
bookkeeping touches ``rows x k`` numbers.

Both classes share one interface, driven by the engine once per decoder step:

- ``num_rows``: rows the request occupies in the batch at the next step (1 for greedy, K for
  beam search after its first step, which runs one row);
- ``top_k``: how many candidates per row the search needs (1 greedy, 2K beam);
- ``bans()`` / ``watch_ids()``: the rows' extra banned ids (rows, b) and watched ids (w,) for
  the next step, or None (the engine always bans pad and, by default, unk, and watches its
  bans beside a search's watched ids);
- ``advance(head) -> (next_tokens, parent_rows)``: ``head`` is the request's rows of the
  step's ``StepOutput``; returns the tokens to feed next (rows,) and, per new row, the row
  (0..rows-1 within the request) whose cache it continues;
- ``done``, ``result()`` and ``hypotheses()``: generated ids without the start token, the
  forced prefix and eos; ``hypotheses()`` is the n-best list (beam search), best first.

Forced prefix (``forced_prefix``, optional): ids every row generates first, one per step,
whatever the model prefers: the target-language code of a multilingual model (M2M-100 /
NLLB), as transformers' ``forced_bos_token_id`` does. Such a step's only candidate is the
forced id with log-probability 0 (the logits processor's ``-inf`` elsewhere, 0 on the id),
so beams keep the scores they had. It is per request, so rows bound for different languages
share every decoder step; ``max_new_tokens`` counts the forced ids, as ``generate`` does.

Semantics are those of ``models/search.py`` (themselves those of ``transformers.generate``):
pad is never generated; bans act on log-probabilities as transformers' logits processors do;
beam search keeps 2K candidates, finished hypotheses are normalised by
``length ** length_penalty``, and it stops with the ``early_stopping=False`` heuristic.

Placeholder constraint (``CopyConstraint``, optional): service/runtime/constraints.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from service.runtime.constraints import CopyConstraint, make_constraint
from service.runtime.model_io import ModelInfo, StepOutput
from service.runtime.types import DecodeRequest


class _Search:
    """What greedy and beam search share: limits, the constraint's hooks."""

    top_k: int

    def __init__(
        self,
        max_new_tokens: int,
        eos_id: int,
        pad_id: int,
        constraint,
        forced_prefix: tuple[int, ...] = (),
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.constraint: CopyConstraint | None = constraint
        self.forced_prefix = tuple(forced_prefix)
        self.steps = 0
        self.done = False

    @property
    def num_rows(self) -> int:
        """Rows the request occupies in the batch at the next step."""
        return 1

    def bans(self) -> np.ndarray | None:
        return self.constraint.bans() if self.constraint is not None else None

    def watch_ids(self) -> np.ndarray | None:
        return self.constraint.watch_ids() if self.constraint is not None else None

    def _candidates(self, head: StepOutput) -> tuple[np.ndarray, np.ndarray]:
        """(rows, top_k) log-probs and ids of this step's candidates."""
        scores, ids = head.top_log_probs[:, : self.top_k], head.top_ids[:, : self.top_k]
        if self.steps < len(self.forced_prefix):
            forced_scores = np.full(scores.shape, -np.inf, dtype=np.float32)
            forced_ids = np.full(ids.shape, self.pad_id, dtype=ids.dtype)
            forced_scores[:, 0] = 0.0
            forced_ids[:, 0] = self.forced_prefix[self.steps]
            return forced_scores, forced_ids
        if self.constraint is not None:
            steps_left = self.max_new_tokens - self.steps
            return self.constraint.candidates(scores, ids, head, steps_left)
        return scores, ids


class GreedySearch(_Search):
    top_k = 1

    def __init__(
        self,
        max_new_tokens: int,
        eos_id: int,
        pad_id: int,
        copy_tokens: dict[int, int] | None = None,
        forced_prefix: tuple[int, ...] = (),
    ) -> None:
        constraint = make_constraint(copy_tokens, 1, eos_id, pad_id)
        super().__init__(max_new_tokens, eos_id, pad_id, constraint, forced_prefix)
        self.tokens: list[int] = []  # the forced prefix included

    def advance(self, head: StepOutput) -> tuple[np.ndarray, np.ndarray]:
        """head of 1 row -> next token (1,), parent row (1,)."""
        _, ids = self._candidates(head)
        token = int(ids[0, 0])
        self.take(token)
        return np.array([token], dtype=np.int64), np.zeros(1, dtype=np.int64)

    def follows_head(self) -> bool:
        """Whether this step's token is the head's own best (no forced id due, no symbol
        owed): then ``take(head.top_ids[row, 0])`` is ``advance`` without its numpy."""
        return self.steps >= len(self.forced_prefix) and (
            self.constraint is None or not self.constraint.owes
        )

    def take(self, token: int) -> None:
        """Generate ``token``."""
        self.steps += 1
        if token == self.eos_id:
            self.done = True
        else:
            self.tokens.append(token)
            self.done = self.steps >= self.max_new_tokens
        if self.constraint is not None:
            self.constraint.emitted(0, token)

    def result(self) -> list[int]:
        return self.tokens[len(self.forced_prefix) :]

    def hypotheses(self) -> list[list[int]]:
        return [self.result()]


class BeamSearch(_Search):
    def __init__(
        self,
        beam_size: int,
        max_new_tokens: int,
        eos_id: int,
        pad_id: int,
        length_penalty: float = 1.0,
        copy_tokens: dict[int, int] | None = None,
        forced_prefix: tuple[int, ...] = (),
    ) -> None:
        constraint = make_constraint(copy_tokens, beam_size, eos_id, pad_id)
        super().__init__(max_new_tokens, eos_id, pad_id, constraint, forced_prefix)
        self.beam_size = beam_size
        self.top_k = 2 * beam_size
        self.length_penalty = length_penalty
        self.running_tokens: list[list[int]] = [[] for _ in range(beam_size)]
        # All beams start identical: keep one alive (float32, as in the reference).
        self.running_scores = np.full(beam_size, -1e9, dtype=np.float32)
        self.running_scores[0] = 0.0
        # (normalised score, tokens with the forced prefix), best first
        self.finished: list[tuple[float, list[int]]] = []

    @property
    def num_rows(self) -> int:
        """K, and one before the first step: every beam starts from the same token with the
        same (empty) cache and only the first is alive, so one row computes what K would (as
        CTranslate2 does); the first step's K beams all continue that row."""
        return self.beam_size if self.steps else 1

    def advance(self, head: StepOutput) -> tuple[np.ndarray, np.ndarray]:
        """head of K rows (or the one row of a first step) -> next tokens (K,), parent beams
        (K,): ``advance_beams`` of one."""
        beams = self.beam_size
        rows = np.arange(beams) if len(head.top_ids) == beams else np.zeros(beams, np.int64)
        tokens, parents = advance_beams([self], head, rows[None])
        return tokens[0], parents[0]

    def special_step(self) -> bool:
        """Whether this step's candidates are not the head's own (a forced id due, a symbol
        owed): ``_candidates`` builds them."""
        return self.steps < len(self.forced_prefix) or (
            self.constraint is not None and self.constraint.owes
        )

    def result(self) -> list[int]:
        return self.finished[0][1][len(self.forced_prefix) :] if self.finished else []

    def hypotheses(self) -> list[list[int]]:
        """The finished hypotheses, best first (at most K): the n-best list."""
        return [tokens[len(self.forced_prefix) :] for _, tokens in self.finished]


def advance_beams(
    searches: Sequence[BeamSearch], head: StepOutput, beam_rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One step of several beam searches of the same beam size K at once: beam k of
    ``searches[i]`` reads row ``beam_rows[i, k]`` of ``head`` (R, K). Returns the next beams'
    tokens (R, K) and, per next beam, the beam (0..K-1 within its request) it continues.

    The choice of candidates is one numpy call over an (R, K x 2K) array; Python only
    touches what each request must keep (its tokens, its finished hypotheses, its stop test).
    """
    count, beams = len(searches), searches[0].beam_size
    width = 2 * beams
    rows = np.asarray(beam_rows, dtype=np.int64).reshape(-1)
    scores = head.top_log_probs[rows, :width]  # (R*K, 2K) fancy indexing: copies
    ids = head.top_ids[rows, :width]
    for index, search in enumerate(searches):
        if search.special_step():
            block = slice(index * beams, (index + 1) * beams)
            scores[block], ids[block] = search._candidates(_head_rows(head, rows[block]))
    # The best 2K of all K*V candidates are among each beam's best 2K (a beam's running
    # score shifts its whole row), which is what the search head returns.
    running = np.stack([search.running_scores for search in searches])  # (R, K)
    flat_scores = (scores.reshape(count, beams, width) + running[:, :, None]).astype(np.float32)
    flat_scores = flat_scores.reshape(count, beams * width)
    flat_ids = ids.reshape(count, beams * width)
    # Ties: the lower index into the K*V candidates first (beam-major, then token id).
    tiebreak = (np.repeat(np.arange(beams, dtype=np.int64), width) << 32) + flat_ids
    chosen = np.lexsort((tiebreak, -flat_scores), axis=-1)[:, :width]  # (R, 2K)
    top_scores = np.take_along_axis(flat_scores, chosen, axis=1)
    top_token = np.take_along_axis(flat_ids, chosen, axis=1)
    top_beam = chosen // width
    for search in searches:
        search.steps += 1  # generated tokens including the one chosen now
    lengths = np.array([[search.steps, search.max_new_tokens] for search in searches])
    eos = np.array([search.eos_id for search in searches])
    ends = (top_token == eos[:, None]) | (lengths[:, :1] == lengths[:, 1:])
    # A banned candidate (-inf: fewer than 2K allowed) never becomes a hypothesis.
    ends &= np.isfinite(top_scores)

    # Candidates ranked within the top K that end here become finished hypotheses.
    ending_requests, ending_ranks = np.nonzero(ends[:, :beams])
    if len(ending_requests):
        ending = zip(ending_requests.tolist(), ending_ranks.tolist(), strict=True)
        _finish(searches, ending, top_scores, top_beam, top_token)

    # The best K candidates that do not end continue.
    open_scores = top_scores - np.float32(1e9) * ends.astype(np.float32)
    keep_rank = np.argsort(-open_scores, axis=1, kind="stable")[:, :beams]
    keep_beam = np.take_along_axis(top_beam, keep_rank, axis=1).astype(np.int64)
    keep_token = np.take_along_axis(top_token, keep_rank, axis=1).astype(np.int64)
    kept_scores = np.take_along_axis(open_scores, keep_rank, axis=1).astype(np.float32)
    beam_lists, token_lists = keep_beam.tolist(), keep_token.tolist()
    best_running = kept_scores[:, 0].tolist()
    for index, search in enumerate(searches):
        tokens = search.running_tokens
        search.running_tokens = [
            tokens[beam] + [token]
            for beam, token in zip(beam_lists[index], token_lists[index], strict=True)
        ]
        search.running_scores = kept_scores[index]
        if search.constraint is not None:
            search.constraint.advance(keep_token[index], keep_beam[index])
        # transformers' early_stopping=False heuristic: stop once the best running beam,
        # normalised at its current length, cannot beat the worst of K finished hypotheses.
        length = search.steps
        finished = search.finished
        worst_finished = finished[-1][0] if len(finished) == beams else -1e9
        best = best_running[index] / length**search.length_penalty
        search.done = not best > worst_finished or length >= search.max_new_tokens
    return keep_token, keep_beam


def _head_rows(head: StepOutput, rows: np.ndarray) -> StepOutput:
    """``head``'s rows ``rows``, in that order."""
    return StepOutput(
        head.top_log_probs[rows],
        head.top_ids[rows],
        head.watch_log_probs[rows],
        head.watch_ids[rows],
    )


def _finish(
    searches: Sequence[BeamSearch],
    ending: Iterable[tuple[int, int]],
    top_scores: np.ndarray,
    top_beam: np.ndarray,
    top_token: np.ndarray,
) -> None:
    """The candidates at (request, rank) ``ending`` join their requests' finished
    hypotheses (in rank order), which keep their best K."""
    touched: list[BeamSearch] = []
    for index, rank in ending:
        search = searches[index]
        token = int(top_token[index, rank])
        hypothesis = list(search.running_tokens[int(top_beam[index, rank])])
        if token != search.eos_id:
            hypothesis.append(token)
        normaliser = search.steps**search.length_penalty
        search.finished.append((float(top_scores[index, rank]) / normaliser, hypothesis))
        if not touched or touched[-1] is not search:
            touched.append(search)
    for search in touched:
        search.finished.sort(key=lambda item: item[0], reverse=True)
        del search.finished[search.beam_size :]


def make_search(request: DecodeRequest, info: ModelInfo) -> GreedySearch | BeamSearch:
    """The search ``request`` asks for, on the model's special ids. Its new tokens are bounded
    by the model's positions too: they index a table of ``max_positions`` rows."""
    max_new_tokens = min(request.max_new_tokens, info.max_positions)
    options = (request.copy_tokens, request.forced_prefix)
    if request.beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {request.beam_size}")
    if request.beam_size == 1:
        return GreedySearch(max_new_tokens, info.eos_id, info.pad_id, *options)
    return BeamSearch(
        request.beam_size,
        max_new_tokens,
        info.eos_id,
        info.pad_id,
        request.length_penalty,
        *options,
    )
