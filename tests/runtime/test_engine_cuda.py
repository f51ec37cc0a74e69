"""The same engine parity on CUDA. Skipped unless a CUDA session really runs on the GPU
(onnxruntime-gpu lists CUDAExecutionProvider even where it cannot load CUDA)."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from service.runtime.engine import Engine
from service.runtime.onnx_model import cuda_is_usable
from service.runtime.types import DecodeRequest
from tests.onnx_helpers import padded_sources, reference

pytestmark = [
    pytest.mark.cuda,
    # Cheap first check (no export needed); the fixture then checks CUDA really loads.
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(),
        reason="onnxruntime has no CUDA execution provider",
    ),
]

MAX_NEW = 12

pytest_plugins = ["tests.onnx_fixtures"]  # the session-scoped `exported` fixture


@pytest.fixture(scope="module")
def cuda_engine(exported):
    if not cuda_is_usable(exported.onnx_dir / "kv_select.onnx"):
        pytest.skip("no usable CUDA execution provider")
    return Engine.from_dir(exported.onnx_dir, provider="cuda")


def test_cuda_engine_really_runs_on_cuda(cuda_engine):
    assert cuda_engine.provider == "cuda"
    assert cuda_engine.model.decoder.get_providers()[0] == "CUDAExecutionProvider"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cuda_engine_matches_reference_search(cuda_engine, exported, beam_size):
    _, _, sources = padded_sources(exported.model, [12, 4, 8, 10, 6, 9, 7, 11])
    expected = reference(exported.model, sources, beam_size, MAX_NEW)
    assert (
        cuda_engine.translate_ids(sources, beam_size=beam_size, max_new_tokens=MAX_NEW) == expected
    )


def test_cuda_caches_stay_on_the_device(cuda_engine, exported):
    _, _, sources = padded_sources(exported.model, [7, 5], seed=5)
    cuda_engine.add(
        [DecodeRequest("a", sources[0], 2, MAX_NEW), DecodeRequest("b", sources[1], 1, MAX_NEW)]
    )
    cuda_engine.step()
    batches = cuda_engine.group_tensors
    assert batches  # both requests are still decoding after one step
    for batch in batches:
        tensors = batch.self_cache.tensors + batch.cross_cache.tensors
        assert all(value.device_name().lower() == "cuda" for value in tensors)
    cuda_engine.drop(["a", "b"])
    assert cuda_engine.active_requests == 0


def test_cuda_continuous_batching_matches_alone(cuda_engine, exported):
    _, _, sources = padded_sources(exported.model, [5, 12, 3, 9], seed=11)
    beams = [1, 4, 2, 1]
    finished = {}
    for step in range(200):
        if step < len(sources):
            cuda_engine.add([DecodeRequest(step, sources[step], beams[step], MAX_NEW)])
        finished.update({done.request_id: done.tokens for done in cuda_engine.step()})
        if step >= len(sources) and not cuda_engine.active_requests:
            break
    for i, (source, beam) in enumerate(zip(sources, beams, strict=True)):
        assert finished[i] == reference(exported.model, [source], beam, MAX_NEW)[0]
