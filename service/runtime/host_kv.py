"""KV caches as numpy arrays on the host (the CPU provider), in buffers reused from a pool.

The graphs run with ``InferenceSession.run``; row gathers, column slices and merges are numpy
indexing. Self-attention caches keep ``SPARE_SLOTS`` zeroed slots at the right end (masked): a
step writes its new keys there in place, and the cache is copied only when it fills (once
every ``SPARE_SLOTS`` steps) or rows leave or join. Finished caches' buffers go back to a
``BufferPool`` (service/runtime/buffer_pool.py) for the next ones.
"""

from __future__ import annotations

import numpy as np

from service.runtime import contract
from service.runtime.buffer_pool import DEFAULT_MAX_FREE_BYTES, BufferPool
from service.runtime.contract import SCREEN_INPUT
from service.runtime.kv_cache import KVCache, ModelSessions
from service.runtime.model_io import StepInputs, StepOutput

SEARCH_OUTPUTS = list(contract.SEARCH_OUTPUTS)
# Spare slots a host self-attention cache keeps for the next steps' keys. More means fewer
# copies as it grows (one per SPARE_SLOTS steps) but more masked slots that every step's
# attention reads (SPARE_SLOTS / 2 on average): docs/engine.md, "Caches with spare slots".
SPARE_SLOTS = 16


class HostKV:
    """Caches as numpy arrays (CPU provider only), in buffers reused from a ``BufferPool``."""

    name = "host"

    def __init__(self, model: ModelSessions, pool_bytes: int = DEFAULT_MAX_FREE_BYTES) -> None:
        self.model = model
        self.pool = BufferPool(model.kv_dtype, pool_bytes)

    def _shape(self, rows: int, capacity: int) -> tuple[int, int, int, int]:
        info = self.model.info
        return (rows, info.num_heads, capacity, info.head_dim)

    def _copied(self, arrays: list[np.ndarray], length: int, capacity: int) -> list[np.ndarray]:
        """New caches of ``capacity`` slots holding the first ``length`` of ``arrays``, the rest
        zeroed."""
        copies = [self.pool.empty(self._shape(len(array), capacity)) for array in arrays]
        for copy, array in zip(copies, arrays, strict=True):
            copy[:, :, :length] = array[:, :, :length]
            copy[:, :, length:] = 0
        return copies

    @staticmethod
    def _spare(grows: bool) -> int:
        """Spare slots a copy of a cache keeps: self-attention caches only."""
        return SPARE_SLOTS if grows else 0

    def empty(self, rows: int) -> KVCache:
        shape = self._shape(rows, SPARE_SLOTS)
        tensors = [self.pool.zeros(shape) for _ in range(2 * self.model.info.num_layers)]
        return KVCache(tensors, 0, grows=True)

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> KVCache:
        tensors = self.model.encoder.run(
            self.model.cross_names,
            {
                "input_ids": np.ascontiguousarray(input_ids, dtype=np.int64),
                "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
            },
            self.model.run_options,
        )
        return KVCache(tensors, input_ids.shape[1])

    def decode(
        self, inputs: StepInputs, past: KVCache, cross: KVCache
    ) -> tuple[StepOutput, KVCache]:
        model = self.model
        feeds = inputs.feeds()
        capacity, length = past.tensors[0].shape[2], past.length
        if capacity > length:  # spare slots: masked for every row
            mask = feeds["self_attention_mask"]  # (N, P+T)
            full = np.zeros((len(mask), capacity + mask.shape[1] - length), dtype=np.int64)
            full[:, :length], full[:, capacity:] = mask[:, :length], mask[:, length:]
            feeds["self_attention_mask"] = full  # (N, C+T)
        feeds.update(zip(model.past_names, past.tensors, strict=True))
        feeds.update(zip(model.cross_names, cross.tensors, strict=True))
        if model.vocab_screen_feed is not None:
            feeds[SCREEN_INPUT] = model.vocab_screen_feed
        outputs = model.decoder.run(SEARCH_OUTPUTS + model.new_names, feeds, model.run_options)
        del feeds  # it refers to the caches: a full one's buffers go back to the pool below
        head = StepOutput(outputs[0], outputs[1], outputs[2], inputs.watch_ids)
        new = outputs[3:]  # 2L x (N, H, T, Dh)
        grown = length + new[0].shape[2]
        tensors = past.consume()
        if grown > capacity:  # full: one copy into a cache with SPARE_SLOTS free again
            full_tensors, tensors = tensors, self._copied(tensors, length, grown + SPARE_SLOTS)
            self.pool.recycle(full_tensors)
        for target, value in zip(tensors, new, strict=True):
            target[:, :, length:grown] = value
        return head, KVCache(tensors, grown, grows=True)

    def select(self, cache: KVCache, rows: np.ndarray, start: int, end: int) -> KVCache:
        count, length, kept = cache.tensors[0].shape[0], cache.length, len(rows)
        if start == 0 and end == length and kept <= count:
            # In place, copying only the rows that continue another row's (the right side is
            # gathered first, so rows that swap read the old values); the caches are this
            # batch's own arrays. Few rows moved (a beam step: only the rows of beams that
            # died take a copy, with or without rows leaving), or rows retiring with the
            # others in order (every finished request: the rows after the first gap move
            # down, and the cache becomes a view of its first rows, no new buffer; the spare
            # slots stay zero as they were). Whole rows are copied, spare slots included:
            # contiguous copies cost less than the valid slots' strided ones.
            moved = np.flatnonzero(rows != np.arange(kept))
            few_moved = len(moved) <= kept // 2  # two copies of them (gather, write) < one of all
            if few_moved or (kept < count and _increasing(rows)):
                sources = rows[moved]
                for value in cache.tensors:  # whole rows (spare slots are zero in both)
                    value[moved] = value[sources]
                tensors = cache.consume()
                if kept < count:
                    tensors = [value[:kept] for value in tensors]
                return KVCache(tensors, length, cache.grows)
        if start == 0 and end == length:
            tensors = self._gathered_whole(cache.tensors, rows)
        else:
            tensors = self._gathered(cache.tensors, rows, start, end, self._spare(cache.grows))
        self.pool.recycle(cache.consume())
        return KVCache(tensors, end - start, cache.grows)

    def _gathered_whole(self, tensors: list[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
        """Every slot of the rows wanted, spare ones included (zero, as every cache keeps
        them), into new caches of the same capacity: a beam reorder's gather copies whole
        contiguous rows, where gathering the valid slots alone writes a strided view (half
        the host's time of a beam-4 step at 256 rows was such gathers)."""
        gathered = []
        for value in tensors:
            target = self.pool.empty((len(rows), *value.shape[1:]))
            np.take(value, rows, axis=0, out=target, mode="clip")
            gathered.append(target)
        return gathered

    def _gathered(
        self, tensors: list[np.ndarray], rows: np.ndarray, start: int, end: int, spare: int
    ) -> list[np.ndarray]:
        """One gather along axis 0 of the slots wanted, straight into new caches."""
        kept = end - start
        gathered = [self.pool.empty(self._shape(len(rows), kept + spare)) for _ in tensors]
        for target, value in zip(gathered, tensors, strict=True):
            np.take(value[:, :, start:end], rows, axis=0, out=target[:, :, :kept], mode="clip")
            target[:, :, kept:] = 0
        return gathered

    def merge(self, first: KVCache, second: KVCache, length: int, left: bool) -> KVCache:
        spare = self._spare(first.grows)
        tensors = [
            _host_merge(
                self.pool.empty(self._shape(len(a) + len(b), length + spare)),
                a[:, :, : first.length],
                b[:, :, : second.length],
                length,
                left,
            )
            for a, b in zip(first.tensors, second.tensors, strict=True)
        ]
        self.pool.recycle(first.consume())
        self.pool.recycle(second.consume())
        return KVCache(tensors, length, first.grows)

    def release(self, cache: KVCache) -> None:
        self.pool.recycle(cache.consume())

    def from_numpy(self, arrays: list[np.ndarray], grows: bool = True) -> KVCache:
        length = arrays[0].shape[2]
        return KVCache(self._copied(arrays, length, length + self._spare(grows)), length, grows)

    def to_numpy(self, cache: KVCache) -> list[np.ndarray]:
        """Copies: the cache's buffers are reused once it is consumed."""
        return [value[:, :, : cache.length].copy() for value in cache.tensors]


def _increasing(rows: np.ndarray) -> bool:
    """Strictly increasing row indices (a subsequence of the rows, order kept)."""
    return len(rows) < 2 or bool((rows[1:] > rows[:-1]).all())


def _host_merge(
    out: np.ndarray, a: np.ndarray, b: np.ndarray, length: int, left: bool
) -> np.ndarray:
    """Host caches (Na, H, La, Dh), (Nb, H, Lb, Dh) -> ``out`` (Na+Nb, H, length + spare, Dh):
    rows of ``a`` then ``b``, each zero-padded on axis 2 to ``length`` (on the left or the
    right), then spare zero slots; one pass over the data."""
    n = a.shape[0]
    out[:, :, length:] = 0
    for part, rows in ((a, slice(0, n)), (b, slice(n, None))):
        pad = length - part.shape[2]
        if left:
            out[rows, :, pad:length] = part
            out[rows, :, :pad] = 0
        else:
            out[rows, :, : part.shape[2]] = part
            out[rows, :, part.shape[2] : length] = 0
    return out
