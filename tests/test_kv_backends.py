"""The KV backends' cache operations against plain numpy: host (numpy arrays) and device
(OrtValues moved by the helper graphs) on the CPU provider, and device on CUDA where a GPU
really runs (skipped otherwise). The engine calls nothing else to move caches, so these pin
what both backends must agree on: select (reorder, retire, repeat, trim), merge with left
and right padding, empty caches, and a decoder call's presents."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from service.onnx_model import OnnxSeq2Seq, StepInputs, cuda_is_usable

pytest_plugins = ["tests.onnx_fixtures"]  # the session-scoped `exported` fixture


@pytest.fixture(scope="module", params=["host-cpu", "device-cpu", "device-cuda"])
def model(exported, request):
    kv_backend, provider = request.param.split("-")
    if provider == "cuda" and not (
        "CUDAExecutionProvider" in ort.get_available_providers()
        and cuda_is_usable(exported.onnx_dir / "kv_select.onnx")
    ):
        pytest.skip("no usable CUDA execution provider")
    loaded = OnnxSeq2Seq(exported.onnx_dir, provider=provider, kv_backend=kv_backend)
    assert loaded.kv.name == kv_backend and loaded.provider == provider
    return loaded


def upload(model: OnnxSeq2Seq, arrays: list[np.ndarray]):
    if model.kv.name == "host":
        return [np.ascontiguousarray(a) for a in arrays]
    device = "cuda" if model.provider == "cuda" else "cpu"
    return [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), device, 0) for a in arrays]


def download(values) -> list[np.ndarray]:
    return [v if isinstance(v, np.ndarray) else v.numpy() for v in values]


def random_cache(model: OnnxSeq2Seq, rows: int, length: int, seed: int) -> list[np.ndarray]:
    info = model.info
    rng = np.random.default_rng(seed)
    shape = (rows, info.num_heads, length, info.head_dim)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(2 * info.num_layers)]


def test_select_gathers_rows_and_trims_columns(model):
    cache = random_cache(model, rows=5, length=7, seed=1)
    rows = np.array([3, 3, 0, 4])  # a beam reorder with a repeat, rows 1 and 2 retired
    got = download(model.kv.select(upload(model, cache), rows, 2, 6))
    for value, expected in zip(got, cache, strict=True):
        assert np.array_equal(value, expected[rows][:, :, 2:6])


@pytest.mark.parametrize("left", [True, False])
def test_merge_pads_each_side_to_the_length_on_the_left_or_right(model, left):
    first, second = random_cache(model, 2, 5, seed=2), random_cache(model, 3, 2, seed=3)
    got = download(model.kv.merge(upload(model, first), upload(model, second), 6, left=left))
    for value, a, b in zip(got, first, second, strict=True):
        assert value.shape == (5, a.shape[1], 6, a.shape[3])
        if left:  # newest slots aligned at the right end
            assert np.array_equal(value[:2, :, 1:], a) and not value[:2, :, :1].any()
            assert np.array_equal(value[2:, :, 4:], b) and not value[2:, :, :4].any()
        else:
            assert np.array_equal(value[:2, :, :5], a) and not value[:2, :, 5:].any()
            assert np.array_equal(value[2:, :, :2], b) and not value[2:, :, 2:].any()


def test_merge_with_an_empty_cache_of_newcomers(model):
    running = random_cache(model, 2, 4, seed=4)
    got = download(model.kv.merge(upload(model, running), model.kv.empty(3), 4, left=True))
    for value, a in zip(got, running, strict=True):
        assert value.shape[0] == 5 and np.array_equal(value[:2], a) and not value[2:].any()


def test_decode_presents_and_search_head_match_the_host_backend(model, exported):
    """One decoder call on the same inputs: the presents and the head agree with the host
    backend's (exactly on CPU, to float tolerance on CUDA)."""
    reference = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    info = model.info
    rows, past, src = 3, 4, 6
    rng = np.random.default_rng(5)
    src_ids = rng.integers(2, info.vocab_size - 1, (rows, src))
    src_mask = np.ones_like(src_ids)
    src_mask[1, 4:] = 0
    inputs = StepInputs(
        input_ids=rng.integers(2, info.vocab_size - 1, (rows, 1)),
        positions=np.full((rows, 1), past),
        self_attention_mask=np.ones((rows, past + 1), dtype=np.int64),
        encoder_attention_mask=src_mask,
        top_k=4,
        banned_ids=np.full((rows, 2), info.pad_id),
        watch_ids=np.tile(np.array([2, 3]), (rows, 1)),
    )
    pasts = random_cache(model, rows, past, seed=6)
    outputs = []
    for backend_model in (reference, model):
        cross = backend_model.kv.encode(src_ids, src_mask)
        head, present = backend_model.kv.decode(inputs, upload(backend_model, pasts), cross)
        outputs.append((head, download(present)))
    (want_head, want_present), (got_head, got_present) = outputs
    tolerance = 1e-3 if model.provider == "cuda" else 0.0
    for got, want in zip(got_present, want_present, strict=True):
        np.testing.assert_allclose(got, want, atol=tolerance)
    np.testing.assert_allclose(got_head.top_log_probs, want_head.top_log_probs, atol=tolerance)
    assert np.array_equal(got_head.top_ids, want_head.top_ids)
