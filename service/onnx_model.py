"""The exported encoder/decoder on ONNX Runtime, with the KV caches kept on the device.

No torch here: onnxruntime and numpy only.

Caches are lists of ``OrtValue`` living on the session's device, always in the order
``[key_0 .. key_{L-1}, value_0 .. value_{L-1}]``, each (N, H, length, Dh). Every call uses IO
binding: cache outputs are bound to the device and fed back as inputs of the next step, and
row gathers / column slices / concatenation run in two tiny helper graphs on the same provider
(``kv_select.onnx``, ``kv_concat.onnx``, written by ``python -m export``). Only token ids,
positions, masks (host int64, a few bytes per row) go in and logits come out.

On the CPU provider the caches are host memory anyway, so by default (``host_kv``) they are
plain numpy arrays: the graphs run with ``InferenceSession.run`` on numpy inputs and row
gathers / column slices / concatenation are numpy indexing, which is several times cheaper
than a helper-graph call plus IO binding for the small tensors of one decoder step. The device
path (IO binding, helper graphs) still runs on CPU with ``host_kv=False``, which is how the
CUDA path is tested without a GPU; both paths compute the same graphs on the same values.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

log = logging.getLogger(__name__)

ProviderName = Literal["auto", "cuda", "cpu"]
# 2L tensors (N, H, length, Dh): keys of every layer, then values. OrtValues on the device path,
# C-contiguous numpy arrays on the host path (``OnnxSeq2Seq.host_kv``).
Cache = list[ort.OrtValue] | list[np.ndarray]

_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}


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


class OnnxSeq2Seq:
    """Encoder, decoder and cache helpers of one export directory on one execution provider."""

    def __init__(
        self,
        model_dir: str | Path,
        provider: ProviderName = "auto",
        intra_op_threads: int = 0,
        host_kv: bool | None = None,
    ):
        """``host_kv``: keep the caches as numpy arrays and gather/concatenate them with numpy
        (None: exactly when the provider is CPU; True needs the CPU provider)."""
        self.model_dir = Path(model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        self.info = ModelInfo.from_config(config, self.model_dir.name)
        self.kv_dtype = _NUMPY_DTYPES[self.info.kv_dtype]
        layers = self.info.num_layers
        self.past_names = [f"past_key_{i}" for i in range(layers)] + [
            f"past_value_{i}" for i in range(layers)
        ]
        self.present_names = [f"present_key_{i}" for i in range(layers)] + [
            f"present_value_{i}" for i in range(layers)
        ]
        self.cross_names = [f"cross_key_{i}" for i in range(layers)] + [
            f"cross_value_{i}" for i in range(layers)
        ]

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra_op_threads:
            options.intra_op_num_threads = intra_op_threads
        self._options = options
        self.provider, self.encoder = self._first_session(self.model_dir / "encoder.onnx", provider)
        providers = self._providers(self.provider)
        self.decoder = ort.InferenceSession(
            str(self.model_dir / "decoder.onnx"), options, providers=providers
        )
        if host_kv and self.provider != "cpu":
            raise ValueError(f"host_kv needs the CPU provider, the model runs on {self.provider}")
        self.host_kv = self.provider == "cpu" if host_kv is None else host_kv
        self.kv_select: ort.InferenceSession | None = None
        self.kv_concat: ort.InferenceSession | None = None
        if not self.host_kv:
            self.kv_select = ort.InferenceSession(
                str(self.model_dir / "kv_select.onnx"), options, providers=providers
            )
            self.kv_concat = ort.InferenceSession(
                str(self.model_dir / "kv_concat.onnx"), options, providers=providers
            )
        self.device_type = "cuda" if self.provider == "cuda" else "cpu"
        self.device_id = 0
        self._decoder_outputs = ["logits", *self.present_names]

    # --- sessions ---------------------------------------------------------------------------

    @staticmethod
    def _providers(provider: str) -> list:
        if provider == "cuda":
            return [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
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
                    str(path), self._options, providers=self._providers("cuda")
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
            str(path), self._options, providers=self._providers("cpu")
        )

    # --- device values ----------------------------------------------------------------------

    def empty_cache(self, rows: int) -> Cache:
        """2L caches of length 0, (rows, H, 0, Dh), on the device."""
        shape = (rows, self.info.num_heads, 0, self.info.head_dim)
        empty = np.zeros(shape, dtype=self.kv_dtype)
        if self.host_kv:
            return [empty] * (2 * self.info.num_layers)  # no data: sharing one is safe
        return [
            ort.OrtValue.ortvalue_from_numpy(empty, self.device_type, self.device_id)
            for _ in range(2 * self.info.num_layers)
        ]

    def _bind_outputs(self, binding: ort.IOBinding, names: list[str]) -> None:
        for name in names:
            binding.bind_output(name, self.device_type, self.device_id)

    # --- graphs -----------------------------------------------------------------------------

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> Cache:
        """input_ids, attention_mask (M, S) int64 -> cross keys/values (M, H, S, Dh) on the device."""
        if self.host_kv:
            return self.encoder.run(
                self.cross_names,
                {
                    "input_ids": np.ascontiguousarray(input_ids, dtype=np.int64),
                    "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
                },
            )
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
        binding.bind_cpu_input(
            "attention_mask", np.ascontiguousarray(attention_mask, dtype=np.int64)
        )
        self._bind_outputs(binding, self.cross_names)  # encoder_hidden_states is not needed
        self.encoder.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return list(binding.get_outputs())

    def decode(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        self_attention_mask: np.ndarray,
        past: Cache,
        cross: Cache,
        encoder_attention_mask: np.ndarray,
    ) -> tuple[np.ndarray, Cache]:
        """One decoder call. input_ids, positions (N, T); self_attention_mask (N, P+T);
        past (N, H, P, Dh) x 2L; cross (N, H, S, Dh) x 2L; encoder_attention_mask (N, S).
        Returns logits (N, T, V) as a host float32 array and the present caches (N, H, P+T, Dh)."""
        if self.host_kv:
            feeds = {
                "input_ids": np.ascontiguousarray(input_ids, dtype=np.int64),
                "positions": np.ascontiguousarray(positions, dtype=np.int64),
                "self_attention_mask": np.ascontiguousarray(self_attention_mask, dtype=np.int64),
                "encoder_attention_mask": np.ascontiguousarray(
                    encoder_attention_mask, dtype=np.int64
                ),
            }
            feeds.update(zip(self.past_names, past, strict=True))
            feeds.update(zip(self.cross_names, cross, strict=True))
            logits, *present = self.decoder.run(self._decoder_outputs, feeds)
            return logits.astype(np.float32, copy=False), present
        binding = self.decoder.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
        binding.bind_cpu_input("positions", np.ascontiguousarray(positions, dtype=np.int64))
        binding.bind_cpu_input(
            "self_attention_mask", np.ascontiguousarray(self_attention_mask, dtype=np.int64)
        )
        binding.bind_cpu_input(
            "encoder_attention_mask", np.ascontiguousarray(encoder_attention_mask, dtype=np.int64)
        )
        for name, value in zip(self.past_names, past, strict=True):
            binding.bind_ortvalue_input(name, value)
        for name, value in zip(self.cross_names, cross, strict=True):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")  # the only float tensor that crosses to the host
        self._bind_outputs(binding, self.present_names)
        self.decoder.run_with_iobinding(binding)
        binding.synchronize_outputs()
        outputs = binding.get_outputs()
        logits = outputs[0].numpy().astype(np.float32, copy=False)
        return logits, list(outputs[1:])

    def select(self, cache: Cache, rows: np.ndarray, start: int, end: int) -> Cache:
        """cache (N, H, L, Dh) x 2L -> cache[rows][:, :, start:end] on the device."""
        if self.host_kv:
            # Basic slicing first (a view), then one gather copy along axis 0: contiguous.
            return [np.take(value[:, :, start:end], rows, axis=0) for value in cache]
        assert self.kv_select is not None
        binding = self.kv_select.io_binding()
        for j, value in enumerate(cache):
            binding.bind_ortvalue_input(f"x_{j}", value)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        binding.bind_cpu_input("start", np.array([start], dtype=np.int64))
        binding.bind_cpu_input("end", np.array([end], dtype=np.int64))
        self._bind_outputs(binding, [f"y_{j}" for j in range(len(cache))])
        self.kv_select.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return list(binding.get_outputs())

    def concat(self, first: Cache, second: Cache) -> Cache:
        """Rows of ``first`` then ``second``, both zero-padded at the end of axis 2 to the longer."""
        if self.host_kv:
            return [_host_concat(a, b) for a, b in zip(first, second, strict=True)]
        assert self.kv_concat is not None
        binding = self.kv_concat.io_binding()
        for j, (a, b) in enumerate(zip(first, second, strict=True)):
            binding.bind_ortvalue_input(f"a_{j}", a)
            binding.bind_ortvalue_input(f"b_{j}", b)
        self._bind_outputs(binding, [f"y_{j}" for j in range(len(first))])
        self.kv_concat.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return list(binding.get_outputs())


def _host_concat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """kv_concat on host arrays: (Na, H, La, Dh), (Nb, H, Lb, Dh) -> (Na+Nb, H, max, Dh)."""
    if a.shape[2] == b.shape[2]:
        return np.concatenate([a, b])
    length = max(a.shape[2], b.shape[2])
    out = np.zeros((a.shape[0] + b.shape[0], a.shape[1], length, a.shape[3]), dtype=a.dtype)
    if a.shape[2]:
        out[: a.shape[0], :, : a.shape[2]] = a
    if b.shape[2]:
        out[a.shape[0] :, :, : b.shape[2]] = b
    return out
