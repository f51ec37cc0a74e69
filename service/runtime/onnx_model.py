"""The exported encoder/decoder sessions on ONNX Runtime, and the KV backend that runs them.

No torch here: onnxruntime and numpy only.

``OnnxSeq2Seq`` opens the sessions of one export directory on one execution provider (CUDA
where it really runs, else the CPU) and owns a ``KVBackend`` (service/runtime/kv_cache.py): the
only code that knows where caches live. ``HostKV`` (numpy, service/runtime/host_kv.py) on the
CPU provider, ``DeviceKV`` (OrtValues, service/runtime/device_kv.py) otherwise.

The engine (service/runtime/engine.py) asks the backend to do things; it never asks which one
it is. Every decoder call returns a ``StepOutput`` (service/runtime/model_io.py): the search
head's top-k (export/search_head.py), never the full logits.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

from service.runtime import contract
from service.runtime.buffer_pool import DEFAULT_MAX_FREE_BYTES
from service.runtime.contract import SCREEN_INPUT
from service.runtime.device_kv import DeviceKV
from service.runtime.host_kv import HostKV
from service.runtime.kv_cache import KVBackend
from service.runtime.model_io import ModelInfo

log = logging.getLogger(__name__)

ProviderName = Literal["auto", "cuda", "cpu"]

# The CUDA provider's options. TF32 off: with it, fp32 matrix products round their inputs to
# 10-bit mantissas, and an fp32 export on an H100 drifted from the CPU by 7e-3 in its K/V
# (measured, BENCHMARKS.md § GPU); fp32 is the exact variant, fp16 the fast one.
CUDA_OPTIONS = {"device_id": 0, "use_tf32": 0}
KVBackendName = Literal["host", "device"]

_NUMPY_DTYPES: dict[str, type[np.floating]] = {"float32": np.float32, "float16": np.float16}
SCREEN_ON, SCREEN_OFF = np.array(True), np.array(False)


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


def runs_on_cpu(model_dir: str | Path, provider: ProviderName) -> bool:
    """Whether an export opened with ``provider`` runs on the CPU (``auto``: unless CUDA
    really runs it, as ``OnnxSeq2Seq`` decides)."""
    if provider == "cpu":
        return True
    if provider == "cuda":
        return False
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return True
    return not cuda_is_usable(Path(model_dir) / contract.ENCODER_FILE)


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
        """``kv_backend``: "host" (numpy caches; CPU provider only) or "device" (OrtValues, the
        device decoder and helper graphs); None: host on the CPU provider, device otherwise.
        ``kv_pool_bytes``: the most free memory the host backend keeps for reuse
        (service/runtime/buffer_pool.py).
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
        if kv_backend is None:
            kv_backend = "host" if self.provider == "cpu" else "device"
        if kv_backend == "host" and self.provider != "cpu":
            raise ValueError(f"host KV caches need the CPU provider, not {self.provider}")
        self.decoder_file = self._decoder_file(kv_backend)
        self.decoder = ort.InferenceSession(
            str(self.model_dir / self.decoder_file), options, providers=self.session_providers
        )
        # The exact int8 screen of greedy steps (export/vocab_screen.py), where the export has
        # one: on the CPU provider only (on CUDA the projection is compute, not a stream of
        # weights, and the screen's int8 ops have no CUDA kernels). None: no such input.
        self.vocab_screen_feed: np.ndarray | None = None
        if any(value.name == SCREEN_INPUT for value in self.decoder.get_inputs()):
            wanted = vocab_screen and self.provider == "cpu"
            self.vocab_screen_feed = SCREEN_ON if wanted else SCREEN_OFF
        self.kv: KVBackend = HostKV(self, kv_pool_bytes) if kv_backend == "host" else DeviceKV(self)
        # The run options of the host backend's calls (None: ONNX Runtime's defaults).
        self.run_options: ort.RunOptions | None = None

    def release_free_memory(self, calls: Callable[[], object]) -> None:
        """Drop the host caches' free buffers, then run ``calls`` (calls of both sessions,
        such as a warm-up) so that each hands its arena's free regions back to the system at
        its end. Each session's CPU arena, and the cache pool, keep what the largest calls so
        far needed: after the start-up calibration's batches of 64 rows, about 170 MB for the
        two shipped models that serving small batches never uses (both grow again when a
        load needs it). The host backend only; elsewhere ``calls`` just run."""
        if self.provider != "cpu" or not isinstance(self.kv, HostKV):
            calls()
            return
        self.kv.pool.release()
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        try:
            calls()
        finally:
            self.run_options = None

    def _decoder_file(self, kv_backend: KVBackendName) -> str:
        """Device caches: the decoder that gathers and grows its cache inside the call
        (export/device_decoder.py), where the export has one; exports written before it have
        only ``decoder.onnx``, and ``DeviceKV`` then moves the caches with helper graphs. A
        device decoder older than ``decoder.onnx`` was not derived from it (a tool rewrote the
        decoder alone): it is not used."""
        device = self.model_dir / contract.DEVICE_DECODER_FILE
        if kv_backend != "device" or not device.exists():
            return contract.DECODER_FILE
        if device.stat().st_mtime < (self.model_dir / contract.DECODER_FILE).stat().st_mtime:
            log.warning("%s is older than %s: not used", device, contract.DECODER_FILE)
            return contract.DECODER_FILE
        return contract.DEVICE_DECODER_FILE

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
