"""The exported encoder/decoder on ONNX Runtime, and the two places its KV caches can live.

No torch here: onnxruntime and numpy only.

``OnnxSeq2Seq`` opens the sessions of one export directory on one execution provider and owns
a ``KVBackend``: the only code that knows where caches live. A cache is a ``KVCache``: 2L tensors
(N, H, capacity, Dh) in the order ``[key_0 .. key_{L-1}, value_0 .. value_{L-1}]`` whose first
``length`` slots hold it. The decoder graph attends over every slot the mask allows and returns
only the new tokens' keys and values (export/onnx_export.py); where they go is the backend's
business.

``HostKV``
    numpy arrays; the graphs run with ``InferenceSession.run`` and row gathers, column slices
    and merges are numpy indexing. On the CPU provider the caches are host memory anyway, and
    this is several times cheaper than a helper-graph call plus IO binding for the small
    tensors of one decoder step. Self-attention caches keep ``SPARE_SLOTS`` zeroed slots at
    the right end (masked): a step writes its new keys there in place, and the cache is
    copied only when it fills (once every ``SPARE_SLOTS`` steps) or rows leave or join.
``DeviceKV``
    ``OrtValue``s on the session's device. Every call uses IO binding: cache outputs stay on
    the device and are fed back as the next step's inputs; gathers, slices, merges and appends
    run in three tiny helper graphs on the same provider (``kv_select.onnx``, ``kv_merge.onnx``,
    ``kv_append.onnx``, written by ``python -m export``). Only token ids, positions, masks and
    bans go in (host int64, a few bytes per row) and the search head's ``rows x k`` outputs
    come out. Its caches have no spare slots (ONNX Runtime's Python API cannot write into part
    of a device tensor): each step appends with one ``Concat`` per tensor. It also runs on the
    CPU provider, which is how the CUDA code path is tested without a GPU: both backends
    compute the same graphs on the same values.

The engine (service/runtime/engine.py) asks the backend to do things; it never asks which one it is.
Every decoder call returns a ``StepOutput``: the search head's top-k (export/search_head.py),
never the full logits.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import onnxruntime as ort

from service.runtime import contract
from service.runtime.buffer_pool import DEFAULT_MAX_FREE_BYTES, BufferPool
from service.runtime.contract import SCREEN_INPUT

log = logging.getLogger(__name__)

ProviderName = Literal["auto", "cuda", "cpu"]

# The CUDA provider's options. TF32 off: with it, fp32 matrix products round their inputs to
# 10-bit mantissas, and an fp32 export on an H100 drifted from the CPU by 7e-3 in its K/V
# (measured, BENCHMARKS.md § GPU); fp32 is the exact variant, fp16 the fast one.
CUDA_OPTIONS = {"device_id": 0, "use_tf32": 0}
KVBackendName = Literal["host", "device"]

_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}
SEARCH_OUTPUTS = list(contract.SEARCH_OUTPUTS)
SCREEN_ON, SCREEN_OFF = np.array(True), np.array(False)
# Spare slots a host self-attention cache keeps for the next steps' keys. More means fewer
# copies as it grows (one per SPARE_SLOTS steps) but more masked slots that every step's
# attention reads (SPARE_SLOTS / 2 on average): docs/engine.md, "Caches with spare slots".
SPARE_SLOTS = 16


class KVCache:
    """2L tensors (N, H, capacity, Dh), keys of every layer then values, whose slots
    ``[0, length)`` hold the cache. C-contiguous numpy arrays (HostKV) or OrtValues on the
    session's device (DeviceKV). ``grows``: a self-attention cache (new keys are appended every
    step, so the host keeps spare slots), not cross keys/values.

    A backend operation that returns a new cache *consumes* the caches it was given (``decode``
    its ``past``, ``select`` and ``merge`` their inputs): their tensors may be reused for other
    caches (service/runtime/buffer_pool.py), so touching a consumed cache raises instead of reading
    another request's keys."""

    def __init__(self, tensors: list, length: int, grows: bool = False) -> None:
        self._tensors: list | None = tensors
        self.length = length
        self.grows = grows

    @property
    def tensors(self) -> list:
        if self._tensors is None:
            raise RuntimeError("KV cache already consumed: use the cache the backend returned")
        return self._tensors

    def consume(self) -> list:
        """The tensors, which this cache gives up."""
        tensors = self.tensors
        self._tensors = None
        return tensors

    def __repr__(self) -> str:
        state = "consumed" if self._tensors is None else f"{len(self._tensors)} tensors"
        return f"KVCache({state}, length={self.length}, grows={self.grows})"


@dataclass(frozen=True)
class ModelInfo:
    """What the runtime needs to know about an export (read from its config.json)."""

    model_name: str
    num_layers: int
    num_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    pad_id: int
    eos_id: int
    unk_id: int
    decoder_start_id: int
    variant: str
    kv_dtype: str

    @classmethod
    def from_config(cls, config: dict, default_name: str) -> ModelInfo:
        ids = config["special_ids"]
        return cls(
            model_name=config.get("model_name") or default_name,
            num_layers=config["num_layers"],
            num_heads=config["num_heads"],
            head_dim=config["head_dim"],
            vocab_size=config["vocab_size"],
            max_positions=config["max_positions"],
            pad_id=ids["pad_id"],
            eos_id=ids["eos_id"],
            unk_id=ids["unk_id"],
            decoder_start_id=ids["decoder_start_id"],
            variant=config.get("variant", "fp32"),
            kv_dtype=config.get("kv_dtype", "float32"),
        )


@dataclass(frozen=True)
class StepInputs:
    """Host inputs of one decoder call over N rows (all int64)."""

    input_ids: np.ndarray  # (N, T)
    positions: np.ndarray  # (N, T)
    self_attention_mask: np.ndarray  # (N, P+T)
    encoder_attention_mask: np.ndarray  # (N, S)
    top_k: int
    banned_ids: np.ndarray  # (N, B): -inf before the log-softmax (pad-filled)
    watch_ids: np.ndarray  # (N, W): log-probs (before bans) wanted besides the top k

    @classmethod
    def lockstep(
        cls,
        tokens: np.ndarray,
        position: int,
        encoder_attention_mask: np.ndarray,
        top_k: int,
        pad_id: int,
        bans: int = 1,
    ) -> StepInputs:
        """Rows that all started together and are at ``position``: no late joiners, pad
        banned (``bans`` columns of it), nothing watched (calibration, variant checks)."""
        rows = len(tokens)
        return cls(
            input_ids=tokens,
            positions=np.full((rows, 1), position, dtype=np.int64),
            self_attention_mask=np.ones((rows, position + 1), dtype=np.int64),
            encoder_attention_mask=encoder_attention_mask,
            top_k=top_k,
            banned_ids=np.full((rows, bans), pad_id, dtype=np.int64),
            watch_ids=np.full((rows, 1), pad_id, dtype=np.int64),
        )

    def feeds(self) -> dict[str, np.ndarray]:
        as_int64 = lambda array: np.ascontiguousarray(array, dtype=np.int64)  # noqa: E731
        return {
            "input_ids": as_int64(self.input_ids),
            "positions": as_int64(self.positions),
            "self_attention_mask": as_int64(self.self_attention_mask),
            "encoder_attention_mask": as_int64(self.encoder_attention_mask),
            "top_k": np.array([self.top_k], dtype=np.int64),
            "banned_ids": as_int64(self.banned_ids),
            "watch_ids": as_int64(self.watch_ids),
        }


@dataclass(frozen=True)
class StepOutput:
    """What the host receives from one decoder call: the search head, ``rows x k`` numbers."""

    top_log_probs: np.ndarray  # (N, k) float32, bans applied, best first
    top_ids: np.ndarray  # (N, k) int64
    watch_log_probs: np.ndarray  # (N, W) float32, before the bans
    watch_ids: np.ndarray  # (N, W) int64: the ids watched (an input, kept beside its answer)

    def rows(self, start: int, end: int) -> StepOutput:
        return StepOutput(
            self.top_log_probs[start:end],
            self.top_ids[start:end],
            self.watch_log_probs[start:end],
            self.watch_ids[start:end],
        )


def cuda_is_usable(model_path: str | Path) -> bool:
    """True only if a session of ``model_path`` really runs on CUDA (onnxruntime-gpu *lists*
    CUDA even on hosts where it cannot load the CUDA libraries, then silently runs on CPU)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    try:
        session = ort.InferenceSession(
            str(model_path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    except Exception:  # noqa: BLE001 - any failure to create means "not usable"
        return False
    return session.get_providers()[0] == "CUDAExecutionProvider"


class KVBackend(Protocol):
    """Where the caches live, and the graph calls that read and write them."""

    name: str

    def empty(self, rows: int) -> KVCache:
        """A self-attention cache of length 0 for ``rows`` rows."""

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> KVCache:
        """(M, S) int64 each -> cross keys/values 2L x (M, H, S, Dh)."""

    def decode(
        self, inputs: StepInputs, past: KVCache, cross: KVCache
    ) -> tuple[StepOutput, KVCache]:
        """One decoder call -> the search head's outputs and the cache grown to P+T. ``past``
        is consumed: the result may share its tensors (the host writes into spare slots)."""

    def select(self, cache: KVCache, rows: np.ndarray, start: int, end: int) -> KVCache:
        """cache[rows][:, :, start:end]: beam reorder, retire rows, repeat, trim columns.
        ``cache`` is consumed."""

    def merge(self, first: KVCache, second: KVCache, length: int, left: bool) -> KVCache:
        """Rows of ``first`` then ``second``, each zero-padded on axis 2 to ``length`` on the
        left (self-attention past: newest slots aligned) or the right (sources). Both are
        consumed."""

    def release(self, cache: KVCache) -> None:
        """The caller is done with ``cache`` (its rows all finished): consumed."""

    def from_numpy(self, arrays: list[np.ndarray], grows: bool = True) -> KVCache:
        """A cache holding copies of 2L arrays (N, H, length, Dh) (tests, tools)."""

    def to_numpy(self, cache: KVCache) -> list[np.ndarray]:
        """Copies of the cache's 2L tensors, slots [0, length), as numpy arrays."""


class HostKV:
    """Caches as numpy arrays (CPU provider only), in buffers reused from a ``BufferPool``."""

    name = "host"

    def __init__(self, model: OnnxSeq2Seq, pool_bytes: int = DEFAULT_MAX_FREE_BYTES) -> None:
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
        outputs = model.decoder.run(SEARCH_OUTPUTS + model.new_names, feeds)
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
            # batch's own arrays. A beam reorder (most rows keep their own cache), or rows
            # retiring with the others in order (every finished request: the rows after the
            # first gap move down, and the cache becomes a view of its first rows, no new
            # buffer; the spare slots stay zero as they were).
            moved = np.flatnonzero(rows != np.arange(kept))
            reorder = kept == count and len(moved) <= count // 2
            if reorder or (kept < count and _increasing(rows)):
                sources = rows[moved]
                for value in cache.tensors:
                    value[moved, :, :length] = value[sources, :, :length]
                tensors = cache.consume()
                if kept < count:
                    tensors = [value[:kept] for value in tensors]
                return KVCache(tensors, length, cache.grows)
        tensors = self._gathered(cache.tensors, rows, start, end, self._spare(cache.grows))
        self.pool.recycle(cache.consume())
        return KVCache(tensors, end - start, cache.grows)

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


class DeviceKV:
    """Caches as OrtValues on the session's device, moved only by graphs on that device."""

    name = "device"

    def __init__(self, model: OnnxSeq2Seq) -> None:
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


class OnnxSeq2Seq:
    """Encoder and decoder sessions of one export directory on one execution provider, and the
    KV backend that runs them."""

    def __init__(
        self,
        model_dir: str | Path,
        provider: ProviderName = "auto",
        intra_op_threads: int = 0,
        kv_backend: KVBackendName | None = None,
        kv_pool_bytes: int = DEFAULT_MAX_FREE_BYTES,
        vocab_screen: bool = True,
    ):
        """``kv_backend``: "host" (numpy caches; CPU provider only) or "device" (OrtValues and
        helper graphs); None: host on the CPU provider, device otherwise. ``kv_pool_bytes``:
        the most free memory the host backend keeps for reuse (service/runtime/buffer_pool.py).
        ``vocab_screen``: use the export's int8 screen for greedy steps (CPU; same outputs)."""
        self.model_dir = Path(model_dir)
        config = json.loads((self.model_dir / contract.CONFIG_FILE).read_text())
        contract.check_format(config, self.model_dir)
        self.info = ModelInfo.from_config(config, self.model_dir.name)
        self.kv_dtype = _NUMPY_DTYPES[self.info.kv_dtype]
        layers = self.info.num_layers
        self.past_names = contract.past_names(layers)
        self.new_names = contract.new_names(layers)
        self.cross_names = contract.cross_names(layers)

        options = _session_options(intra_op_threads, spinning=True)
        self.session_options = options
        # The encoder runs once per admission, between decoder steps. Each session has its own
        # intra-op thread pool, and a pool's workers spin for a while after a call: a spinning
        # encoder worker takes a core from the decoder steps that follow (BENCHMARKS.md).
        self.encoder_options = _session_options(intra_op_threads, spinning=False)
        self.provider, self.encoder = self._first_session(
            self.model_dir / contract.ENCODER_FILE, provider
        )
        self.session_providers = self._providers(self.provider)
        self.decoder = ort.InferenceSession(
            str(self.model_dir / contract.DECODER_FILE), options, providers=self.session_providers
        )
        # The exact int8 screen of greedy steps (export/vocab_screen.py), where the export has
        # one: on the CPU provider only (on CUDA the projection is compute, not a stream of
        # weights, and the screen's int8 ops have no CUDA kernels). None: no such input.
        self.vocab_screen_feed: np.ndarray | None = None
        if any(value.name == SCREEN_INPUT for value in self.decoder.get_inputs()):
            wanted = vocab_screen and self.provider == "cpu"
            self.vocab_screen_feed = SCREEN_ON if wanted else SCREEN_OFF
        if kv_backend is None:
            kv_backend = "host" if self.provider == "cpu" else "device"
        if kv_backend == "host" and self.provider != "cpu":
            raise ValueError(f"host KV caches need the CPU provider, not {self.provider}")
        self.kv: KVBackend = HostKV(self, kv_pool_bytes) if kv_backend == "host" else DeviceKV(self)

    @staticmethod
    def _providers(provider: str) -> list:
        if provider == "cuda":
            return [("CUDAExecutionProvider", CUDA_OPTIONS), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def _first_session(
        self, path: Path, requested: ProviderName
    ) -> tuple[str, ort.InferenceSession]:
        """Create the encoder session, checking which provider it really got."""
        if requested not in ("auto", "cuda", "cpu"):
            raise ValueError(f"provider must be auto, cuda or cpu, not {requested!r}")
        if requested != "cpu" and "CUDAExecutionProvider" in ort.get_available_providers():
            try:
                session = ort.InferenceSession(
                    str(path), self.encoder_options, providers=self._providers("cuda")
                )
                if session.get_providers()[0] == "CUDAExecutionProvider":
                    return "cuda", session
                reason = f"session fell back to {session.get_providers()}"
            except Exception as error:  # noqa: BLE001 - reported below
                reason = str(error)
            if requested == "cuda":
                raise RuntimeError(f"CUDA execution provider requested but unusable: {reason}")
            log.warning("CUDA execution provider unusable (%s); running on CPU", reason)
        elif requested == "cuda":
            raise RuntimeError(
                f"CUDA execution provider requested but not available: {ort.get_available_providers()}"
            )
        return "cpu", ort.InferenceSession(
            str(path), self.encoder_options, providers=self._providers("cpu")
        )


def _session_options(intra_op_threads: int, spinning: bool) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


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
