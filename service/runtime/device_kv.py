"""KV caches as ``OrtValue``s on the session's device, moved only by graphs on that device.

Every call uses IO binding: cache outputs stay on the device and are fed back as the next
step's inputs; gathers, slices, merges and appends run in three tiny helper graphs on the same
provider (``kv_select.onnx``, ``kv_merge.onnx``, ``kv_append.onnx``, written by ``python -m
export``). Only token ids, positions, masks and bans go in (host int64, a few bytes per row)
and the search head's ``rows x k`` outputs come out. The caches have no spare slots (ONNX
Runtime's Python API cannot write into part of a device tensor): each step appends with one
``Concat`` per tensor. It also runs on the CPU provider, which is how the CUDA code path is
tested without a GPU.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.runtime import contract
from service.runtime.contract import SCREEN_INPUT
from service.runtime.kv_cache import KVCache, ModelSessions
from service.runtime.model_io import StepInputs, StepOutput

SEARCH_OUTPUTS = list(contract.SEARCH_OUTPUTS)


class DeviceKV:
    """Caches as OrtValues on the session's device, moved only by graphs on that device."""

    name = "device"

    def __init__(self, model: ModelSessions) -> None:
        self.model = model
        providers = model.session_providers
        options = model.session_options
        self.kv_select, self.kv_merge, self.kv_append = (
            ort.InferenceSession(str(model.model_dir / name), options, providers=providers)
            for name in contract.KV_HELPER_FILES
        )
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
        for name, value in zip(model.past_names, past.tensors, strict=True):
            binding.bind_ortvalue_input(name, value)
        for name, value in zip(model.cross_names, cross.tensors, strict=True):
            binding.bind_ortvalue_input(name, value)
        for name in SEARCH_OUTPUTS:  # the only outputs that cross to the host
            binding.bind_output(name, "cpu")
        self._bind_outputs(binding, model.new_names)
        outputs = self._run(model.decoder, binding)
        top_log_probs, top_ids, watch_log_probs = (value.numpy() for value in outputs[:3])
        head = StepOutput(top_log_probs, top_ids, watch_log_probs, inputs.watch_ids)
        new = outputs[3:]  # 2L x (N, H, T, Dh) on the device
        binding = self.kv_append.io_binding()
        for j, (value, added) in enumerate(zip(past.tensors, new, strict=True)):
            binding.bind_ortvalue_input(f"x_{j}", value)
            binding.bind_ortvalue_input(f"new_{j}", added)
        self._bind_outputs(binding, [f"y_{j}" for j in range(len(new))])
        grown = past.length + new[0].shape()[2]
        past.consume()  # as on the host: the backend owns what it was given
        return head, KVCache(self._run(self.kv_append, binding), grown, grows=True)

    def select(self, cache: KVCache, rows: np.ndarray, start: int, end: int) -> KVCache:
        binding = self.kv_select.io_binding()
        for j, value in enumerate(cache.tensors):
            binding.bind_ortvalue_input(f"x_{j}", value)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        binding.bind_cpu_input("start", np.array([start], dtype=np.int64))
        binding.bind_cpu_input("end", np.array([end], dtype=np.int64))
        self._bind_outputs(binding, [f"y_{j}" for j in range(len(cache.tensors))])
        cache.consume()
        return KVCache(self._run(self.kv_select, binding), end - start, cache.grows)

    def merge(self, first: KVCache, second: KVCache, length: int, left: bool) -> KVCache:
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
        return [value.numpy() for value in cache.tensors]  # no spare slots on the device
