"""A group's bans and watched ids for the next decoder call (``StepInputs.banned_ids`` and
``watch_ids``).

Every row bans the engine's static ids (pad, and by default unk); a search with a placeholder
constraint (service/runtime/search.py) adds its rows' own bans and watched ids. Most groups
have no such search: their arrays are the same step after step while the rows stay, built once
(the graph only reads them). A constrained group's arrays are rebuilt only when some search's
own arrays change (a symbol emitted, a beam reordered) or the requests do.
"""

from __future__ import annotations

import numpy as np

from service.runtime.stepping import ActiveRequest


class BanFeeds:
    """Builds (and, without constraints, keeps) a group's ``banned_ids`` and ``watch_ids``."""

    def __init__(self) -> None:
        self._static_key: tuple | None = None  # what ``_static_arrays`` were built for
        self._static_arrays: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))
        # The searches' own bans and watched ids the last arrays were built from: a search
        # hands out the same (read-only) arrays until they change, so most steps reuse them.
        self._searches_key: list[np.ndarray | None] = []
        self._searches_shape: tuple = ()
        self._searches_arrays: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))

    def arrays(
        self,
        requests: list[ActiveRequest],
        rows: int,
        pad_id: int,
        static_bans: list[int],
        constrained: bool,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rows, B) banned ids and (rows, W) watched ids; ``constrained``: whether some
        request's search has a placeholder constraint."""
        if not constrained:
            return self._static(rows, pad_id, static_bans)
        extra_bans = [active.search.bans() for active in requests]
        watched = [active.search.watch_ids() for active in requests]
        key = [*extra_bans, *watched]
        shape = (pad_id, tuple(static_bans), tuple(active.num_rows for active in requests))
        last = self._searches_key
        if (
            shape == self._searches_shape
            and len(key) == len(last)
            and all(a is b for a, b in zip(key, last, strict=True))
        ):
            return self._searches_arrays
        self._searches_arrays = _with_searches(
            requests, rows, pad_id, static_bans, extra_bans, watched
        )
        self._searches_key, self._searches_shape = key, shape
        return self._searches_arrays

    def _static(
        self, rows: int, pad_id: int, static_bans: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        key = (rows, pad_id, tuple(static_bans))
        if self._static_key != key:
            banned = np.empty((rows, len(static_bans)), dtype=np.int64)
            banned[:] = static_bans
            self._static_arrays = (banned, np.full((rows, 1), pad_id, dtype=np.int64))
            self._static_key = key
        return self._static_arrays


def _one_layout(
    first: np.ndarray, bans: list[np.ndarray], watched: list[np.ndarray | None]
) -> bool:
    """Every search watches ``first`` (constraints over one symbol set share their watched
    ids, service/runtime/constraints.py) and bans as many ids: the rows' arrays stack."""
    return all(w is first for w in watched) and all(b.shape[1] == len(first) for b in bans)


def _with_searches(
    requests: list[ActiveRequest],
    rows: int,
    pad_id: int,
    static_bans: list[int],
    extra_bans: list[np.ndarray | None],
    watched: list[np.ndarray | None],
) -> tuple[np.ndarray, np.ndarray]:
    """Bans and watched ids when some search adds its own (placeholder constraints)."""
    present = [bans for bans in extra_bans if bans is not None]
    first = watched[0] if watched else None
    if (
        first is not None
        and len(present) == len(extra_bans)
        and _one_layout(first, present, watched)
    ):
        counts = [active.num_rows for active in requests]
        own = np.concatenate(
            [b if len(b) == n else b[:n] for b, n in zip(present, counts, strict=True)]
        )  # (rows, C + 1): every row constrained over the same symbols
        banned = np.empty((rows, len(static_bans) + own.shape[1]), dtype=np.int64)
        banned[:, : len(static_bans)], banned[:, len(static_bans) :] = static_bans, own
        return banned, np.tile(np.concatenate([first, static_bans]), (rows, 1))
    ban_width = max((b.shape[1] for b in extra_bans if b is not None), default=0)
    banned = np.full((rows, len(static_bans) + ban_width), pad_id, dtype=np.int64)
    banned[:, : len(static_bans)] = static_bans
    # A search that watches ids also sees its row's bans after them: it can tell the argmax
    # before them (service/runtime/search.py).
    watch_width = max((len(w) + len(static_bans) for w in watched if w is not None), default=1)
    watch = np.full((rows, watch_width), pad_id, dtype=np.int64)
    offset = 0
    for active, bans, ids in zip(requests, extra_bans, watched, strict=True):
        end = offset + active.num_rows
        if bans is not None:  # a beam search's first step: its beams' identical first row
            banned[offset:end, len(static_bans) : len(static_bans) + bans.shape[1]] = bans[
                : end - offset
            ]
        if ids is not None:
            watch[offset:end, : len(ids)] = ids
            watch[offset:end, len(ids) : len(ids) + len(static_bans)] = static_bans
        offset = end
    return banned, watch
