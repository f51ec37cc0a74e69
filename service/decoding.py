"""Per-request search state: one small object per request, numpy only.

Both classes share one interface, driven by the engine once per decoder step:

- ``num_rows``: rows the request occupies in the batch (1 for greedy, K for beam search);
- ``advance(logits) -> (next_tokens, parent_rows)``: logits (rows, V) of this step; returns the
  tokens to feed next (rows,) and, per new row, the row (0..rows-1 within the request) whose
  cache it continues (the engine gathers the self-attention cache with them);
- ``done`` and ``result()``: generated ids without the start token and without eos.

Semantics are those of ``models/search.py`` (themselves those of ``transformers.generate``):
pad is never generated; beam search keeps 2K candidates, finished hypotheses are normalised by
``length ** length_penalty``, and it stops with the ``early_stopping=False`` heuristic. Greedy
is its own class: argmax needs no log-softmax and no hypothesis bookkeeping.

Placeholder constraint (``CopyConstraint``, optional): symbols that stand for placeholders
must come out exactly as often as the source has them. Per row it bans the symbols the row
may not emit (absent from the source, or already emitted as often as the source has them) and
bans eos while the row still owes symbols; once the steps left equal the symbols owed, only
owed symbols are allowed. It masks the logits (banned = -inf) before log-softmax and top-k,
so beam scores are those of the constrained distribution. Without a constraint nothing
changes (the parity tests against ``models/search.py`` hold).
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(N, V) float32 -> (N, V) float32 log-probabilities."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top_k_descending(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of a 1-D array, largest first (ties: lower index first)."""
    if k < scores.shape[0]:
        candidates = np.argpartition(scores, scores.shape[0] - k)[scores.shape[0] - k :]
    else:
        candidates = np.arange(scores.shape[0])
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order]


def row_top_k(values: np.ndarray, k: int, block: int = 64) -> np.ndarray:
    """Indices of the k largest entries of every row of ``values`` (R, V), unordered, (R, k).

    Two-level selection: the top k entries of a row lie in the k blocks (of ``block`` entries)
    with the largest maxima, so one vectorised max over the row plus two small partitions
    replace a partition of the whole row (several times faster at V ~ 58k; beam search runs
    it on every row at every step)."""
    rows, vocab = values.shape
    num_blocks = -(-vocab // block)
    if num_blocks <= k:
        return np.argpartition(values, vocab - k, axis=1)[:, vocab - k :]
    padded = values
    if num_blocks * block != vocab:
        padded = np.full((rows, num_blocks * block), -np.inf, dtype=values.dtype)
        padded[:, :vocab] = values
    blocks = padded.reshape(rows, num_blocks, block)
    best_blocks = np.argpartition(blocks.max(axis=2), num_blocks - k, axis=1)[:, num_blocks - k :]
    candidates = np.take_along_axis(blocks, best_blocks[:, :, None], axis=1).reshape(
        rows, k * block
    )
    candidate_index = (best_blocks[:, :, None] * block + np.arange(block)).reshape(rows, k * block)
    chosen = np.argpartition(candidates, k * block - k, axis=1)[:, k * block - k :]
    return np.take_along_axis(candidate_index, chosen, axis=1)


class CopyConstraint:
    """Per-row counts of the symbols each row still owes, for one request.

    ``copy_tokens`` maps every constrained token id (the placeholder symbols of the
    vocabulary) to how often the source has it; ids with count 0 are never emitted. Rows
    (beams) each keep their own counts, reordered with their parents by ``advance``.
    """

    def __init__(self, copy_tokens: dict[int, int], rows: int, eos_id: int) -> None:
        if any(count < 0 for count in copy_tokens.values()):
            raise ValueError("copy_tokens counts must be >= 0")
        self.ids = np.array(sorted(copy_tokens), dtype=np.int64)  # (C,)
        self._slot = {int(token): slot for slot, token in enumerate(self.ids)}
        counts = np.array([copy_tokens[int(token)] for token in self.ids], dtype=np.int64)
        self.remaining = np.tile(counts, (rows, 1))  # (rows, C)
        self.eos_id = eos_id

    def mask(self, logits: np.ndarray, steps_left: int) -> np.ndarray:
        """logits (rows, V) -> a masked float32 copy; ``steps_left``: tokens each row may
        still generate, the one chosen now included."""
        masked = logits.astype(np.float32, copy=True)
        exhausted = self.remaining <= 0  # (rows, C)
        rows, slots = np.nonzero(exhausted)
        masked[rows, self.ids[slots]] = -np.inf
        owed = self.remaining.sum(axis=1)  # (rows,)
        wants_to_stop = logits.argmax(axis=1) == self.eos_id  # (rows,)
        masked[owed > 0, self.eos_id] = -np.inf
        # A row that would stop, or has no room for anything else, emits the symbols it owes
        # now: otherwise a banned eos makes it ramble until the symbols are forced at the end.
        forced = (owed > 0) & ((owed >= steps_left) | wants_to_stop)
        if forced.any():
            keep = masked[forced][:, self.ids]
            masked[forced] = -np.inf
            masked[np.ix_(np.flatnonzero(forced), self.ids)] = keep
        return masked

    def advance(self, tokens: np.ndarray, parents: np.ndarray) -> None:
        """The rows continue ``parents`` with ``tokens``: reorder, count emitted symbols."""
        self.remaining = self.remaining[parents]
        for row, token in enumerate(tokens):
            slot = self._slot.get(int(token))
            if slot is not None:
                self.remaining[row, slot] -= 1


def make_constraint(
    copy_tokens: dict[int, int] | None, rows: int, eos_id: int
) -> CopyConstraint | None:
    return CopyConstraint(copy_tokens, rows, eos_id) if copy_tokens else None


class GreedySearch:
    num_rows = 1

    def __init__(
        self,
        max_new_tokens: int,
        eos_id: int,
        pad_id: int,
        copy_tokens: dict[int, int] | None = None,
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.constraint = make_constraint(copy_tokens, 1, eos_id)
        self.tokens: list[int] = []
        self.steps = 0
        self.done = False

    def advance(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """logits (1, V) -> next token (1,), parent row (1,)."""
        if self.constraint is not None:
            logits = self.constraint.mask(logits, self.max_new_tokens - self.steps)
        scores = logits[0].astype(np.float32, copy=True)
        scores[self.pad_id] = -np.inf
        token = int(scores.argmax())
        self.steps += 1
        if token == self.eos_id:
            self.done = True
        else:
            self.tokens.append(token)
            self.done = self.steps >= self.max_new_tokens
        next_tokens, parents = np.array([token], dtype=np.int64), np.zeros(1, dtype=np.int64)
        if self.constraint is not None:
            self.constraint.advance(next_tokens, parents)
        return next_tokens, parents

    def result(self) -> list[int]:
        return list(self.tokens)


class BeamSearch:
    def __init__(
        self,
        beam_size: int,
        max_new_tokens: int,
        eos_id: int,
        pad_id: int,
        length_penalty: float = 1.0,
        copy_tokens: dict[int, int] | None = None,
    ) -> None:
        self.num_rows = beam_size
        self.constraint = make_constraint(copy_tokens, beam_size, eos_id)
        self.max_new_tokens = max_new_tokens
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.length_penalty = length_penalty
        self.running_tokens: list[list[int]] = [[] for _ in range(beam_size)]
        # All beams start identical: keep one alive (float32, as in the reference).
        self.running_scores = np.full(beam_size, -1e9, dtype=np.float32)
        self.running_scores[0] = 0.0
        self.finished: list[tuple[float, list[int]]] = []  # (normalised score, tokens), best first
        self.steps = 0
        self.done = False

    def advance(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """logits (K, V) -> next tokens (K,), parent beams (K,)."""
        num_beams = self.num_rows
        if self.constraint is not None:
            logits = self.constraint.mask(logits, self.max_new_tokens - self.steps)
        log_probs = log_softmax(logits.astype(np.float32, copy=False))  # (K, V)
        log_probs[:, self.pad_id] = -np.inf
        vocab = log_probs.shape[-1]
        # The best 2K of all K*V candidates are among each beam's best 2K (a beam's running
        # score shifts its whole row), so select per row first: K partitions of V instead of
        # one of K*V, where the dead beams' equal -1e9 scores make selection slow.
        width = min(2 * num_beams, vocab)
        row_best = row_top_k(log_probs, width)  # (K, 2K)
        row_scores = np.take_along_axis(log_probs, row_best, axis=1) + self.running_scores[:, None]
        flat_index = (np.arange(num_beams)[:, None] * vocab + row_best).reshape(-1)  # into K*V
        flat_scores = row_scores.reshape(-1)
        chosen = top_k_descending(flat_scores, 2 * num_beams)  # (2K,)
        top_index, top_scores = flat_index[chosen], flat_scores[chosen]
        top_beam, top_token = top_index // vocab, top_index % vocab
        self.steps += 1
        length = self.steps  # generated tokens including the one chosen now
        ends = (top_token == self.eos_id) | (length == self.max_new_tokens)
        # A banned candidate (-inf: pad, or a constraint's ban when fewer than 2K candidates
        # are allowed) never becomes a hypothesis.
        ends &= np.isfinite(top_scores)
        normaliser = length**self.length_penalty

        # Candidates ranked within the top K that end here become finished hypotheses.
        for rank in range(num_beams):
            if ends[rank]:
                hypothesis = list(self.running_tokens[top_beam[rank]])
                if top_token[rank] != self.eos_id:
                    hypothesis.append(int(top_token[rank]))
                self.finished.append((float(top_scores[rank]) / normaliser, hypothesis))
        self.finished.sort(key=lambda item: item[0], reverse=True)
        del self.finished[num_beams:]

        # The best K candidates that do not end continue.
        open_scores = top_scores - np.float32(1e9) * ends.astype(np.float32)
        keep_rank = top_k_descending(open_scores, num_beams)
        keep_beam, keep_token = top_beam[keep_rank], top_token[keep_rank]
        self.running_tokens = [
            self.running_tokens[beam] + [int(token)]
            for beam, token in zip(keep_beam, keep_token, strict=True)
        ]
        self.running_scores = open_scores[keep_rank].astype(np.float32)
        if self.constraint is not None:
            self.constraint.advance(keep_token, keep_beam)

        # transformers' early_stopping=False heuristic: stop once the best running beam,
        # normalised at its current length, cannot beat the worst of K finished hypotheses.
        best_running = float(self.running_scores[0]) / normaliser
        worst_finished = self.finished[-1][0] if len(self.finished) == num_beams else -1e9
        self.done = not best_running > worst_finished or length >= self.max_new_tokens
        return keep_token.astype(np.int64), keep_beam.astype(np.int64)

    def result(self) -> list[int]:
        return list(self.finished[0][1]) if self.finished else []


def make_search(
    beam_size: int,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    length_penalty: float = 1.0,
    copy_tokens: dict[int, int] | None = None,
) -> GreedySearch | BeamSearch:
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if beam_size == 1:
        return GreedySearch(max_new_tokens, eos_id, pad_id, copy_tokens)
    return BeamSearch(beam_size, max_new_tokens, eos_id, pad_id, length_penalty, copy_tokens)
