"""Where the KV caches live: the ``KVCache`` a backend hands out and the ``KVBackend`` protocol.

A cache is 2L tensors (N, H, capacity, Dh) in the order ``[key_0 .. key_{L-1}, value_0 ..
value_{L-1}]`` whose first ``length`` slots hold it. The decoder graph attends over every slot
the mask allows and returns only the new tokens' keys and values (export/onnx_export.py); where
they go is the backend's business. Two backends implement the protocol:

``HostKV`` (service/runtime/host_kv.py)
    numpy arrays; the graphs run with ``InferenceSession.run`` and row gathers, column slices
    and merges are numpy indexing. On the CPU provider the caches are host memory anyway, and
    this is several times cheaper than a helper-graph call plus IO binding for the small
    tensors of one decoder step. Self-attention caches keep spare zeroed slots at the right
    end (masked): a step writes its new keys there in place.
``DeviceKV`` (service/runtime/device_kv.py)
    ``OrtValue``s on the session's device. Every call uses IO binding: cache outputs stay on
    the device and are fed back as the next step's inputs. The device decoder gathers, trims
    and grows the self-attention cache inside its call (a ``select`` of it waits for the next
    ``decode``); merges and the cross caches' gathers run in tiny helper graphs on the same
    provider. It also runs on the CPU provider, which is how the CUDA code path is tested
    without a GPU: both backends compute the same graphs on the same values.

A backend reads the sessions it runs through ``ModelSessions`` (``OnnxSeq2Seq``,
service/runtime/onnx_model.py, opens them and picks the backend). The engine asks the backend
to do things; it never asks which one it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort

from service.runtime.model_io import ModelInfo, StepInputs, StepOutput


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


class ModelSessions(Protocol):
    """What a KV backend reads of the model whose sessions it runs (``OnnxSeq2Seq``)."""

    model_dir: Path
    info: ModelInfo
    kv_dtype: type[np.floating]
    provider: str
    encoder: ort.InferenceSession
    decoder: ort.InferenceSession
    session_options: ort.SessionOptions
    session_providers: list
    past_names: list[str]
    new_names: list[str]
    cross_names: list[str]
    vocab_screen_feed: np.ndarray | None
    run_options: ort.RunOptions | None  # of the host backend's calls


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
