"""BufferPool (service/runtime/buffer_pool.py): reuse of host cache buffers, and never of one that is
still referred to."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from service.runtime.buffer_pool import HEADROOM, MAX_WASTE, BufferPool

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_smallest_buffer_that_fits_is_lent_the_oldest_of_equals_first():
    pool = BufferPool(np.float32)
    buffers = [np.empty(size, np.float32) for size in (100, 40, 60, 40, 36)]
    address = [buffer.__array_interface__["data"][0] for buffer in buffers]
    pool.recycle(buffers)
    del buffers

    def lent(shape: tuple[int, ...]) -> int:
        return address.index(pool.empty(shape).__array_interface__["data"][0])

    assert lent((37,)) == 1  # 40 floats: the older of the two
    assert lent((5, 8)) == 3  # the other 40
    assert lent((37,)) == 2  # then 60 (100 is also within MAX_WASTE, but larger)
    assert lent((2, 3, 6)) == 4  # 36 fits exactly
    assert pool.reused == 4 and pool.allocated == 0


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


def test_two_threads_never_get_the_same_buffer():
    """The engine thread and the encoder thread share one pool: with both lending and taking
    back at once, no two arrays alive at the same time share memory."""
    pool = BufferPool(np.float32)
    held: dict[int, list[np.ndarray]] = {0: [], 1: []}
    overlaps: list[int] = []
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        try:
            lend_and_take_back(worker)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    def lend_and_take_back(worker: int) -> None:
        rng = np.random.default_rng(worker)
        for _ in range(2000):
            if held[worker] and rng.random() < 0.5:
                pool.recycle([held[worker].pop(int(rng.integers(len(held[worker]))))])
            else:
                array = pool.empty((int(rng.integers(1, 5)), 64))
                array.fill(worker)  # a buffer lent twice would be overwritten by the other
                held[worker].append(array)
            for array in held[worker]:
                if not (array == worker).all():
                    overlaps.append(worker)

    threads = [threading.Thread(target=churn, args=(worker,)) for worker in (0, 1)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors and not overlaps
    assert pool.reused > 100  # the two threads really exchanged buffers through the pool
    mine, theirs = held[0], held[1]
    assert not any(np.shares_memory(a, b) for a in mine for b in theirs)


def _advised_huge_pages(code: str) -> bool | None:
    """Run ``code`` (which leaves a large numpy array ``array``) in a fresh interpreter and
    say whether the kernel holds the huge-page advice for the memory it lies in (the ``hg``
    flag of its mapping in /proc/self/smaps); None where the kernel shows no flags."""
    probe = (
        "import numpy as np\n"
        f"{code}\n"
        "array[:] = 1\n"
        "address = array.ctypes.data + array.nbytes // 2\n"  # past the unaligned head
        "inside = False\n"
        "for line in open('/proc/self/smaps'):\n"
        "    head = line.split()[0]\n"
        "    if '-' in head and ':' not in head:\n"
        "        start, end = (int(part, 16) for part in head.split('-'))\n"
        "        inside = start <= address < end\n"
        "    elif inside and head == 'VmFlags:':\n"
        "        print('hg' in line.split()[1:])\n"
        "        break\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    answer = result.stdout.strip()
    return None if not answer else answer == "True"


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_cache_buffers_get_no_huge_page_advice():
    """numpy advises huge pages for a large array; a pool's buffers, and numpy's arrays once
    a pool exists, get none (the module's docstring says why)."""
    plain = _advised_huge_pages("array = np.empty(16 << 20, np.float32)")
    if not plain:
        pytest.skip("numpy advises no huge pages here (kernel without transparent huge pages)")
    pooled = _advised_huge_pages(
        "from service.runtime.buffer_pool import BufferPool\n"
        "array = BufferPool(np.float32).empty((16 << 20,))"
    )
    assert pooled is False


def test_release_drops_every_free_buffer():
    pool = BufferPool(np.float32)
    pool.recycle([pool.empty((4, 8)) for _ in range(3)])
    assert pool.free_bytes > 0
    pool.release()
    assert pool.free_bytes == 0
    pool.empty((4, 8))
    assert pool.allocated == 4 and pool.reused == 0  # nothing left to reuse
