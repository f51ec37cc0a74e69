"""The values the runtime and its callers exchange: what to decode and what came of it.

The batcher (service/scheduling/) submits ``DecodeRequest``s and receives ``FinishedRequest``s
from ``Engine.step`` and ``RejectedRequest``s from ``Engine.encode``; before it admits
newcomers it asks for a ``BatchEstimate`` of the batch they would make. None of these holds a
tensor or a session: they are plain values, so the scheduler needs no more of the runtime
than this module and the engine's operations.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class DecodeRequest:
    """One sentence to decode; the batcher submits these as they are."""

    request_id: Hashable = None  # the batcher sets it when it queues the sentence
    src_ids: list[int] | tuple[int, ...] = ()  # already tokenized, ends with eos
    beam_size: int = 1
    max_new_tokens: int = 128
    length_penalty: float = 1.0
    # Placeholder constraint (service/runtime/constraints.py, CopyConstraint): every placeholder-symbol
    # id of the vocabulary -> how often the source has it (0: never emit it). None: none.
    copy_tokens: dict[int, int] | None = None
    # Ids generated first whatever the model prefers, then stripped (search.py): a
    # multilingual model's target-language code. Per row: rows of any languages share steps.
    forced_prefix: tuple[int, ...] = ()


@dataclass
class FinishedRequest:
    """A request whose search ended at the last step (``Engine.step``)."""

    request_id: Hashable
    tokens: list[int]  # generated ids, no start token, no eos
    steps: int  # decoder steps this request took part in
    hypotheses: list[list[int]] = field(default_factory=list)  # n-best, best first


@dataclass(frozen=True)
class RejectedRequest:
    """A request ``Engine.encode`` refused; the others admitted with it proceed."""

    request_id: Hashable
    reason: str


@dataclass(frozen=True)
class BatchEstimate:
    """The running batch as an admission plan foresees it (for the batcher's admission)."""

    rows: int
    padded_tokens: int  # sum over groups of rows x (past + padded source)
    row_limit: int | None = None  # rows past which tokens/s fall (step-cost model), or None
    step_s: float = 0.0  # predicted seconds of the next step (0 before the model is fitted)
    encode_s: float = 0.0  # predicted seconds of the newcomers' encoder calls
    place_s: float = 0.0  # predicted seconds of merging them into the groups they join
