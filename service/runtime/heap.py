"""Handing the C heap's free memory back to the system once start-up is done.

Start-up allocates far more than serving keeps: reading the language detector's lists,
parsing each ONNX model, the calibration's batches of 64 rows. glibc's malloc gives each thread
that allocates an arena of its own and returns freed memory inside an arena to the system only
when it lies at the arena's top, so most of that stays resident after it is freed: about 90 MB
of the 400 MB a process serving the two shipped models held after start-up (bench/memory.py).
``malloc_trim(0)`` walks every arena and returns its free pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``; None on a C library without it (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Return the C heap's free pages to the system; False where the C library cannot."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True
