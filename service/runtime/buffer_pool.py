"""Host memory for KV caches that is reused rather than freshly allocated.

A cache of 128 rows at Marian-base size is 12 arrays of 10-25 MB. numpy often gets arrays that
large from the allocator as fresh pages; the first touch of those pages makes copying a grown
cache an order of magnitude slower than copying into memory touched before (BENCHMARKS.md).
``BufferPool`` keeps the flat buffers of caches the engine is done with and hands
out C-contiguous views of them.

numpy also advises transparent huge pages (``madvise(MADV_HUGEPAGE)``) for every array of a
few MB, and where the kernel defragments on that advice (``defrag`` set to ``madvise``, a
common default) the first touch of an advised buffer waits for the kernel to compact memory
into 2 MB pages: several times the cost of plain pages, paid at every cache that outgrows the
buffers the pool holds. A pool therefore turns that advice off for the process
(``no_huge_page_advice``); the caches are read a step at a time, row by row, where huge pages
save little.

A buffer is only ever handed back by ``HostKV`` for caches it consumed (service/runtime/kv_cache.py:
``KVCache.consume``), and ``recycle`` refuses arrays something else still refers to, so a
reused buffer can never be seen through an old cache. The pool is shared by the engine thread
and the encoder thread (service/scheduling/batcher.py, encoder overlap: newcomers' caches are built there
while the running rows step), so lending and taking back hold a lock: a buffer lent twice
would be two caches in one place.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque

import numpy as np
import numpy.typing as npt

# New buffers get this much headroom: a cache that grows by a few slots at a time then finds,
# every other time, a buffer it can reuse instead of fresh pages.
HEADROOM = 2.0
# A free buffer serves a request for at least 1 / MAX_WASTE of its size (no 1 GB buffer for a
# 1 MB array).
MAX_WASTE = 4.0
DEFAULT_MAX_FREE_BYTES = 1 << 30


def no_huge_page_advice() -> None:
    """Stop numpy advising transparent huge pages for the large arrays it allocates from now
    on, in this process (the module's docstring)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    multiarray._set_madvise_hugepage(False)  # type: ignore[attr-defined]


class BufferPool:
    """Flat host buffers of one dtype, lent out as arrays of any shape that fits."""

    def __init__(self, dtype: npt.DTypeLike, max_free_bytes: int = DEFAULT_MAX_FREE_BYTES) -> None:
        no_huge_page_advice()
        self.dtype = np.dtype(dtype)
        self.max_free_bytes = max_free_bytes
        self._free: deque[np.ndarray] = deque()  # 1-D buffers, oldest first
        self.free_bytes = 0
        self.reused = 0  # arrays served from a free buffer
        self.allocated = 0  # arrays that needed a new buffer
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape``."""
        size = int(math.prod(shape))  # numpy's prod of a tuple costs 5 us, ten times a step
        with self._lock:
            # the smallest free buffer that fits without wasting too much (the oldest of equals)
            best, best_size, limit = -1, 0, MAX_WASTE * max(size, 1)
            for index, free in enumerate(self._free):
                if size <= free.size <= limit and (best < 0 or free.size < best_size):
                    best, best_size = index, free.size
            if best >= 0:
                self.reused += 1
                buffer = self._free[best]
                del self._free[best]
                self.free_bytes -= buffer.nbytes
            else:
                self.allocated += 1
                buffer = None
        if buffer is None:  # allocated outside the lock: the other thread need not wait
            buffer = np.empty(int(size * HEADROOM), self.dtype)
        return buffer[:size].reshape(shape)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        array = self.empty(shape)
        array.fill(0)
        return array

    def recycle(self, arrays: list[np.ndarray]) -> None:
        """Take back the buffers of ``arrays`` (the caller drops them) that nothing else sees."""
        for array in arrays:
            buffer = array if array.base is None else array.base
            if self._unshared(array, buffer):
                flat = buffer.reshape(-1)
                with self._lock:
                    self._free.append(flat)
                    self.free_bytes += flat.nbytes
        with self._lock:
            while self.free_bytes > self.max_free_bytes:
                self.free_bytes -= self._free.popleft().nbytes

    def release(self) -> None:
        """Drop every free buffer (the memory goes back to the allocator)."""
        with self._lock:
            self._free.clear()
            self.free_bytes = 0

    def _unshared(self, array: np.ndarray, buffer: object) -> bool:
        """Whether ``buffer`` is a plain numpy buffer of our dtype that only ``array`` (held by
        the caller's list) refers to. Counted references: the caller's list, the local names
        and getrefcount's own argument; any other holder (another view, a cache the caller kept)
        adds one and the buffer is left to the garbage collector."""
        if not (
            isinstance(buffer, np.ndarray)
            and buffer.dtype == self.dtype
            and buffer.flags.owndata
            and buffer.flags.c_contiguous
            and buffer.flags.writeable
        ):
            return False
        if buffer is array:  # list, recycle's `array` and `buffer`, _unshared's two, argument
            return sys.getrefcount(array) <= 6
        # the view: list, recycle's `array`, _unshared's `array`, argument; the buffer:
        # array.base, recycle's `buffer`, _unshared's `buffer`, argument
        return sys.getrefcount(array) <= 4 and sys.getrefcount(buffer) <= 4
