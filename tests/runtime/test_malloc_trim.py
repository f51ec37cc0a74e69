"""service/runtime/heap.py: start-up's freed memory goes back to the system."""

from __future__ import annotations

import platform

import pytest

from service.runtime import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_returns_freed_memory_to_the_system():
    from pathlib import Path

    def rss_kb() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    # many small objects, freed: pymalloc's arenas go, glibc's heap keeps most of it
    blocks = [bytearray(1000) for _ in range(50_000)]
    del blocks[1::2]  # the survivors pin the heap's top: freeing can't shrink it
    blocks = blocks[:1] + blocks[-1:]
    held = rss_kb()
    assert heap.trim()
    assert rss_kb() < held - 10_000  # > 10 MB of the 50 MB went back
