"""Spans of text, ``(start, end)`` character offsets, and how they meet."""

from __future__ import annotations

from collections.abc import Sequence

Span = tuple[int, int]


def overlaps_any(span: Span, others: Sequence[Span]) -> bool:
    """Whether ``span`` shares a character with any of ``others``."""
    start, end = span
    return any(start < other_end and other_start < end for other_start, other_end in others)
