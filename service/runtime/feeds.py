"""A group's bans and watched ids for the next decoder call (``StepInputs.banned_ids`` and
``watch_ids``).

Every row bans the engine's static ids (pad, and by default unk); a search with a placeholder
constraint (service/runtime/search.py) adds its rows' own bans and watched ids. Most groups
have no such search: their arrays are the same step after step while the rows stay, built once
(the graph only reads them).
"""

from __future__ import annotations

import numpy as np

from service.runtime.stepping import ActiveRequest


class BanFeeds:
    """Builds (and, without constraints, keeps) a group's ``banned_ids`` and ``watch_ids``."""

    def __init__(self) -> None:
        self._static_key: tuple | None = None  # what ``_static_arrays`` were built for
        self._static_arrays: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))

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
        return _with_searches(requests, rows, pad_id, static_bans, extra_bans, watched)

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


def _with_searches(
    requests: list[ActiveRequest],
    rows: int,
    pad_id: int,
    static_bans: list[int],
    extra_bans: list[np.ndarray | None],
    watched: list[np.ndarray | None],
) -> tuple[np.ndarray, np.ndarray]:
    """Bans and watched ids when some search adds its own (placeholder constraints)."""
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
