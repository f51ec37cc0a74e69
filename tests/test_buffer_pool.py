"""BufferPool (service/buffer_pool.py): reuse of host cache buffers, and never of one that is
still referred to."""

from __future__ import annotations

import numpy as np

from service.buffer_pool import HEADROOM, MAX_WASTE, BufferPool


def test_buffers_come_back_for_arrays_that_fit():
    pool = BufferPool(np.float32)
    pool.recycle([pool.empty((4, 8)) for _ in range(2)])
    assert pool.free_bytes == 2 * int(32 * HEADROOM) * 4
    larger = pool.empty((6, 8))  # 48 floats fit the 64 of a returned buffer
    assert larger.shape == (6, 8) and larger.flags.c_contiguous and pool.reused == 1
    too_small_to_hold = pool.empty((4, 8 * int(MAX_WASTE * HEADROOM)))  # needs a new buffer
    assert pool.allocated == 3 and too_small_to_hold.flags.c_contiguous
    assert not np.shares_memory(larger, too_small_to_hold)
    zeros = pool.zeros((2, 8))
    assert pool.reused == 2 and not zeros.any()


def test_buffers_something_else_refers_to_are_not_reused():
    pool = BufferPool(np.float32)
    arrays = [pool.empty((4, 4)) for _ in range(3)]
    view = arrays[0][1:]  # another view of the first buffer
    second = arrays[1]  # a name for the second array
    pool.recycle(arrays)
    del arrays
    reused = [pool.empty((4, 4)) for _ in range(3)]
    assert pool.reused == 1
    for array in reused:
        assert not np.shares_memory(array, view) and not np.shares_memory(array, second)


def test_foreign_and_oversized_buffers_are_refused_and_the_free_list_is_bounded():
    pool = BufferPool(np.float32, max_free_bytes=3 * 64 * 4)
    pool.recycle([np.ones((4, 4), np.float64)])
    assert pool.free_bytes == 0  # another dtype
    pool.recycle([np.ones((8, 8), np.float32)[:, :4]])  # a view: its whole buffer is reused
    assert pool.free_bytes == 64 * 4
    pool.empty((8, 8))
    pool.recycle([np.ones(64, np.float32) for _ in range(5)])
    assert pool.free_bytes == 3 * 64 * 4  # the oldest two were dropped
    reused = pool.reused  # 1: the (8, 8) above
    pool.empty((2,))  # 2 floats would waste most of a 64-float buffer
    assert pool.reused == reused
