"""The placeholder constraint of one request's search rows.

Symbols that stand for placeholders must come out exactly as often as the source has them.
Per row it bans the symbols the row may not emit (absent from the source, or already emitted as often as the source has them) and
bans eos while the row still owes symbols; once the steps left equal the symbols owed, or the
row would stop (its argmax before the bans is eos), only owed symbols are allowed: the row
chooses among them by their log-probabilities renormalised over that set (the watched ids).
"""

from __future__ import annotations

import numpy as np

from service.runtime.model_io import StepOutput


def top_k_descending(scores: np.ndarray, k: int, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest entries of a 1-D array, largest first; ties: lower
    ``tiebreak`` (default: the index) first."""
    tiebreak = np.arange(scores.shape[0]) if tiebreak is None else tiebreak
    order = np.lexsort((tiebreak, -scores))
    return order[:k]


class CopyConstraint:
    """Per-row counts of the symbols each row still owes, for one request.

    ``copy_tokens`` maps every constrained token id (the placeholder symbols of the
    vocabulary) to how often the source has it; ids with count 0 are never emitted. Rows
    (beams) each keep their own counts, reordered with their parents by ``advance``.
    """

    def __init__(self, copy_tokens: dict[int, int], rows: int, eos_id: int, pad_id: int) -> None:
        if copy_tokens and min(copy_tokens.values()) < 0:
            raise ValueError("copy_tokens counts must be >= 0")
        # Built for every request a step admits, over the same symbols each time: their
        # sorted ids, slots and watched ids are shared (read-only), only the counts are own.
        tokens, self.ids, self._slot, self._watch_ids = _layout(frozenset(copy_tokens), eos_id)
        counts = [copy_tokens[token] for token in tokens]
        self.remaining = np.array([counts] * rows, dtype=np.int64).reshape(rows, len(tokens))
        self.eos_id = eos_id
        self.pad_id = pad_id
        # Asked for every step of every row, and most steps change nothing: ``bans`` and
        # ``owes`` are kept until ``advance`` changes ``remaining``; the watched ids never
        # change.
        self._bans: np.ndarray | None = None
        self.owes = rows > 0 and any(counts)  # does any row still owe a symbol?

    def _changed(self) -> None:
        self._bans = None
        self.owes = bool(self.remaining.sum(axis=1).any())

    def bans(self) -> np.ndarray:
        """(rows, C + 1): the symbols each row has used up, and eos while it owes symbols;
        unused slots hold pad (banned anyway). Read-only (cached)."""
        if self._bans is None:
            banned = np.where(self.remaining <= 0, self.ids, self.pad_id)
            owed = self.remaining.sum(axis=1)
            eos = np.where(owed > 0, self.eos_id, self.pad_id)
            self._bans = np.concatenate([banned, eos[:, None]], axis=1)
        return self._bans

    def candidates(
        self,
        scores: np.ndarray,
        ids: np.ndarray,
        head: StepOutput,
        steps_left: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The rows' candidates (log-probs, ids), (rows, k), from the head's top k, except for
        rows that must emit what they owe now: ``steps_left`` tokens each row may still
        generate (the one chosen now included), or the row would stop. A row that would stop
        emits the symbols it owes at once: otherwise a banned eos makes it ramble until the
        symbols are forced at the end."""
        if not self.owes:  # nothing owed: no row is forced (the usual case)
            return scores, ids
        owed = self.remaining.sum(axis=1)  # (rows,)
        wants_to_stop = self._unbanned_best(head, scores[:, 0], ids[:, 0]) == self.eos_id
        forced = np.flatnonzero((owed > 0) & ((owed >= steps_left) | wants_to_stop))
        if not len(forced):
            return scores, ids
        scores, ids = scores.copy(), ids.copy()
        width = ids.shape[1]
        symbols = len(self.ids)
        for row in forced:
            allowed = self.remaining[row] > 0  # (C,)
            log_probs = head.watch_log_probs[row, :symbols].astype(np.float64)
            log_probs = np.where(allowed, log_probs, -np.inf)
            finite = log_probs[allowed]
            peak = finite.max()
            log_probs = log_probs - (peak + np.log(np.exp(finite - peak).sum()))
            order = top_k_descending(log_probs, width, self.ids)
            scores[row] = -np.inf
            ids[row] = self.pad_id
            take = order[: min(width, symbols)]
            scores[row, : len(take)] = log_probs[take]
            ids[row, : len(take)] = self.ids[take]
        return scores, ids

    @staticmethod
    def _unbanned_best(head: StepOutput, top_score: np.ndarray, top_id: np.ndarray) -> np.ndarray:
        """Each row's argmax before any ban (ties: lower id), (rows,). The best allowed id is
        the head's top 1; every banned id is watched (the engine watches its bans, the
        constraint its symbols and eos), with its log-prob before the bans."""
        if len(top_id) == 1:  # one row (greedy): plain Python beats numpy's per-call cost
            ids = [int(top_id[0]), *head.watch_ids[0].tolist()]
            scores = [float(top_score[0]), *head.watch_log_probs[0].tolist()]
            _, negated_id = max(zip(scores, [-token for token in ids], strict=True))
            return np.array([-negated_id])
        candidate_ids = np.concatenate([top_id[:, None], head.watch_ids], axis=1)
        candidate_scores = np.concatenate([top_score[:, None], head.watch_log_probs], axis=1)
        best_score = candidate_scores.max(axis=1, keepdims=True)  # (rows, 1)
        tied_ids = np.where(candidate_scores == best_score, candidate_ids, np.iinfo(np.int64).max)
        return tied_ids.min(axis=1)

    def watch_ids(self) -> np.ndarray:
        """The symbols (their renormalised log-probs when a row must pay what it owes), then
        eos (would the row stop?). Read-only."""
        return self._watch_ids

    def advance(self, tokens: np.ndarray, parents: np.ndarray) -> None:
        """The rows continue ``parents`` with ``tokens``: reorder, count emitted symbols."""
        if len(parents) != len(self.remaining) or (parents != np.arange(len(parents))).any():
            reordered = self.remaining[parents]
            # Beams that owe alike (every row of a source without symbols) swap rows at most
            # steps and change nothing: the bans stay as they are.
            if not np.array_equal(reordered, self.remaining):
                self.remaining = reordered
                self._changed()
        for row, token in enumerate(tokens.tolist()):
            self.emitted(row, token)

    def emitted(self, row: int, token: int) -> None:
        """Row ``row`` emitted ``token`` (in place: no reorder)."""
        slot = self._slot.get(token)
        if slot is not None:
            self.remaining[row, slot] -= 1
            self._changed()


Layout = tuple[list[int], np.ndarray, dict[int, int], np.ndarray]
# One entry a vocabulary's symbol set (and eos): a few in a process.
_LAYOUTS: dict[tuple[frozenset[int], int], Layout] = {}
_MAX_LAYOUTS = 64


def _layout(symbols: frozenset[int], eos_id: int) -> Layout:
    """The symbols sorted, as a read-only id array, their slots, and the watched ids (the
    symbols, then eos): what every constraint over ``symbols`` shares."""
    key = (symbols, eos_id)
    layout = _LAYOUTS.get(key)
    if layout is None:
        tokens = sorted(int(token) for token in symbols)
        ids = np.array(tokens, dtype=np.int64)  # (C,)
        watch_ids = np.array([*tokens, eos_id], dtype=np.int64)
        ids.flags.writeable = watch_ids.flags.writeable = False
        layout = (tokens, ids, {token: slot for slot, token in enumerate(tokens)}, watch_ids)
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout


def make_constraint(
    copy_tokens: dict[int, int] | None, rows: int, eos_id: int, pad_id: int
) -> CopyConstraint | None:
    return CopyConstraint(copy_tokens, rows, eos_id, pad_id) if copy_tokens else None
