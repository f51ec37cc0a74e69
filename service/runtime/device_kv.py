"""KV caches as ``OrtValue``s on the session's device, moved only by graphs on that device.

Every call uses IO binding: cache outputs stay on the device and are fed back as the next
step's inputs. Only token ids, positions, masks and bans go in (host int64, a few bytes per row)
and the search head's ``rows x k`` outputs come out. The caches have no spare slots (ONNX
Runtime's Python API cannot write into part of a device tensor): each step appends with one
``Concat`` per tensor. It also runs on the CPU provider, which is how the CUDA code path is
tested without a GPU.

One session call per step: the device decoder (``decoder_device.onnx``, export/device_decoder.py)
gathers its past rows, trims its left slots and returns the grown cache. So ``select`` on a
self-attention cache only records the rows and the first slot (``PendingGather``), and the next
decoder call does the move: a beam reorder or rows leaving cost no call of their own. Cross
caches (rows leaving), repeats for beams and merges (rows joining) run in the helper graphs
``kv_select.onnx`` and ``kv_merge.onnx``. An export written before the device decoder has only
``decoder.onnx``: every move then runs in the helper graphs, and each step appends with
``kv_append.onnx`` (two calls per step, three or four where rows move).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.runtime import contract
from service.runtime.contract import PAST_ROWS_INPUT, PAST_START_INPUT, SCREEN_INPUT
from service.runtime.kv_cache import KVCache, ModelSessions
from service.runtime.model_io import StepInputs, StepOutput

SEARCH_OUTPUTS = list(contract.SEARCH_OUTPUTS)


class PendingGather(KVCache):
    """A self-attention cache whose row gather and column trim the next decoder call does:
    ``tensor[rows][:, :, start:]`` of every tensor holds it (``length`` slots)."""

    def __init__(self, tensors: list, length: int, rows: np.ndarray, start: int) -> None:
        super().__init__(tensors, length, grows=True)
        self.rows = rows  # (N,) int64
        self.start = start


class DeviceKV:
    """Caches as OrtValues on the session's device, moved only by graphs on that device."""

    name = "device"

    def __init__(self, model: ModelSessions) -> None:
        self.model = model
        # The device decoder moves self-attention caches inside its call (module docstring).
        self.folds = any(value.name == PAST_ROWS_INPUT for value in model.decoder.get_inputs())
        helpers = contract.KV_HELPER_FILES if not self.folds else contract.KV_MOVE_FILES
        sessions = {
            name: ort.InferenceSession(
                str(model.model_dir / name),
                model.session_options,
                providers=model.session_providers,
            )
            for name in helpers
        }
        self.kv_select = sessions[contract.KV_SELECT_FILE]
        self.kv_merge = sessions[contract.KV_MERGE_FILE]
        self.kv_append = sessions.get(contract.KV_APPEND_FILE)  # None: the decoder appends
        layers = model.info.num_layers
        self.cache_outputs = contract.present_names(layers) if self.folds else model.new_names
        self.device_type = "cuda" if model.provider == "cuda" else "cpu"
        self.device_id = 0

    def _bind_outputs(self, binding: ort.IOBinding, names: list[str]) -> None:
        for name in names:
            binding.bind_output(name, self.device_type, self.device_id)

    def _run(self, session: ort.InferenceSession, binding: ort.IOBinding) -> list:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return list(binding.get_outputs())

    def empty(self, rows: int) -> KVCache:
        info = self.model.info
        empty = np.zeros((rows, info.num_heads, 0, info.head_dim), dtype=self.model.kv_dtype)
        return self.from_numpy([empty] * (2 * info.num_layers))

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> KVCache:
        encoder = self.model.encoder
        binding = encoder.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
        binding.bind_cpu_input(
            "attention_mask", np.ascontiguousarray(attention_mask, dtype=np.int64)
        )
        self._bind_outputs(binding, self.model.cross_names)  # hidden states are not needed
        return KVCache(self._run(encoder, binding), input_ids.shape[1])

    def decode(
        self, inputs: StepInputs, past: KVCache, cross: KVCache
    ) -> tuple[StepOutput, KVCache]:
        model = self.model
        binding = model.decoder.io_binding()
        for name, value in inputs.feeds().items():
            binding.bind_cpu_input(name, value)
        if model.vocab_screen_feed is not None:
            binding.bind_cpu_input(SCREEN_INPUT, model.vocab_screen_feed)
        if self.folds:
            rows, start = _gather_of(past, len(inputs.input_ids))
            binding.bind_cpu_input(PAST_ROWS_INPUT, rows)
            binding.bind_cpu_input(PAST_START_INPUT, np.array([start], dtype=np.int64))
        for name, value in zip(model.past_names, past.tensors, strict=True):
            binding.bind_ortvalue_input(name, value)
        for name, value in zip(model.cross_names, cross.tensors, strict=True):
            binding.bind_ortvalue_input(name, value)
        for name in SEARCH_OUTPUTS:  # the only outputs that cross to the host
            binding.bind_output(name, "cpu")
        self._bind_outputs(binding, self.cache_outputs)
        outputs = self._run(model.decoder, binding)
        top_log_probs, top_ids, watch_log_probs = (value.numpy() for value in outputs[:3])
        head = StepOutput(top_log_probs, top_ids, watch_log_probs, inputs.watch_ids)
        caches = outputs[3:]  # 2L x (N, H, P+T, Dh) presents, or (N, H, T, Dh) new keys
        grown = past.length + inputs.input_ids.shape[1]
        if self.kv_append is None:
            past.consume()  # as on the host: the backend owns what it was given
            return head, KVCache(caches, grown, grows=True)
        binding = self.kv_append.io_binding()
        for j, (value, added) in enumerate(zip(past.tensors, caches, strict=True)):
            binding.bind_ortvalue_input(f"x_{j}", value)
            binding.bind_ortvalue_input(f"new_{j}", added)
        self._bind_outputs(binding, [f"y_{j}" for j in range(len(caches))])
        past.consume()
        return head, KVCache(self._run(self.kv_append, binding), grown, grows=True)

    def select(self, cache: KVCache, rows: np.ndarray, start: int, end: int) -> KVCache:
        rows = np.asarray(rows, dtype=np.int64)
        if isinstance(cache, PendingGather):  # a select of a select: one gather of the tensors
            rows, start, end = cache.rows[rows], cache.start + start, cache.start + end
        if self.folds and cache.grows and end == cache.tensors[0].shape()[2]:
            return PendingGather(cache.consume(), end - start, rows, start)
        return KVCache(self._gathered(cache.consume(), rows, start, end), end - start, cache.grows)

    def _gathered(self, tensors: list, rows: np.ndarray, start: int, end: int) -> list:
        """``tensor[rows][:, :, start:end]`` of every tensor: one ``kv_select`` call."""
        binding = self.kv_select.io_binding()
        for j, value in enumerate(tensors):
            binding.bind_ortvalue_input(f"x_{j}", value)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        binding.bind_cpu_input("start", np.array([start], dtype=np.int64))
        binding.bind_cpu_input("end", np.array([end], dtype=np.int64))
        self._bind_outputs(binding, [f"y_{j}" for j in range(len(tensors))])
        return self._run(self.kv_select, binding)

    def _settled(self, cache: KVCache) -> KVCache:
        """``cache`` with its pending gather done (a helper call), for the graphs that read
        cache tensors as they are."""
        if not isinstance(cache, PendingGather):
            return cache
        end = cache.start + cache.length
        tensors = self._gathered(cache.consume(), cache.rows, cache.start, end)
        return KVCache(tensors, cache.length, grows=True)

    def merge(self, first: KVCache, second: KVCache, length: int, left: bool) -> KVCache:
        first, second = self._settled(first), self._settled(second)
        binding = self.kv_merge.io_binding()
        for j, (a, b) in enumerate(zip(first.tensors, second.tensors, strict=True)):
            binding.bind_ortvalue_input(f"a_{j}", a)
            binding.bind_ortvalue_input(f"b_{j}", b)
        # Pad's pads: [begin of axes 0..3, end of axes 0..3]; only axis 2 is padded.
        for tag, cache in (("a", first), ("b", second)):
            pads = np.zeros(8, dtype=np.int64)
            pads[2 if left else 6] = length - cache.length
            binding.bind_cpu_input(f"{tag}_pads", pads)
        self._bind_outputs(binding, [f"y_{j}" for j in range(len(first.tensors))])
        first.consume()
        second.consume()
        return KVCache(self._run(self.kv_merge, binding), length, first.grows)

    def release(self, cache: KVCache) -> None:
        cache.consume()  # ONNX Runtime frees device memory with the last reference

    def from_numpy(self, arrays: list[np.ndarray], grows: bool = True) -> KVCache:
        tensors = [
            ort.OrtValue.ortvalue_from_numpy(
                np.ascontiguousarray(array, dtype=self.model.kv_dtype),
                self.device_type,
                self.device_id,
            )
            for array in arrays
        ]
        return KVCache(tensors, arrays[0].shape[2], grows)

    def to_numpy(self, cache: KVCache) -> list[np.ndarray]:
        arrays = [value.numpy() for value in cache.tensors]  # no spare slots on the device
        if isinstance(cache, PendingGather):
            return [array[cache.rows][:, :, cache.start :] for array in arrays]
        return arrays


def _gather_of(past: KVCache, rows: int) -> tuple[np.ndarray, int]:
    """The device decoder's ``past_rows`` and ``past_start`` for ``past``: its pending gather,
    or every row in order from the first slot."""
    if isinstance(past, PendingGather):
        return past.rows, past.start
    return np.arange(rows, dtype=np.int64), 0
