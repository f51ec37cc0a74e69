"""The KV backends' cache operations against plain numpy: host (numpy arrays) and device
(OrtValues moved by the device decoder and the helper graphs) on the CPU provider, and device on CUDA where a GPU
really runs (skipped otherwise). The engine calls nothing else to move caches, so these pin
what both backends must agree on: select (reorder, retire, repeat, trim), merge with left
and right padding, empty caches, and a decoder call's grown cache (the host writing into spare
slots, the device appending)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from service.runtime.host_kv import SPARE_SLOTS
from service.runtime.model_io import StepInputs
from service.runtime.onnx_model import OnnxSeq2Seq, cuda_is_usable

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


def random_cache(model: OnnxSeq2Seq, rows: int, length: int, seed: int) -> list[np.ndarray]:
    info = model.info
    rng = np.random.default_rng(seed)
    shape = (rows, info.num_heads, length, info.head_dim)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(2 * info.num_layers)]


def test_select_gathers_rows_and_trims_columns(model):
    cache = random_cache(model, rows=5, length=7, seed=1)
    rows = np.array([3, 3, 0, 4])  # a beam reorder with a repeat, rows 1 and 2 retired
    got = model.kv.to_numpy(model.kv.select(model.kv.from_numpy(cache), rows, 2, 6))
    for value, expected in zip(got, cache, strict=True):
        assert np.array_equal(value, expected[rows][:, :, 2:6])


@pytest.mark.parametrize("left", [True, False])
def test_merge_pads_each_side_to_the_length_on_the_left_or_right(model, left):
    first, second = random_cache(model, 2, 5, seed=2), random_cache(model, 3, 2, seed=3)
    got = model.kv.to_numpy(
        model.kv.merge(model.kv.from_numpy(first), model.kv.from_numpy(second), 6, left)
    )
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
    got = model.kv.to_numpy(
        model.kv.merge(model.kv.from_numpy(running), model.kv.empty(3), 4, True)
    )
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
        head, present = backend_model.kv.decode(inputs, backend_model.kv.from_numpy(pasts), cross)
        outputs.append((head, backend_model.kv.to_numpy(present)))
    (want_head, want_present), (got_head, got_present) = outputs
    tolerance = 1e-3 if model.provider == "cuda" else 1e-5  # host: masked spare slots too
    for got, want in zip(got_present, want_present, strict=True):
        np.testing.assert_allclose(got, want, atol=tolerance)
    np.testing.assert_allclose(got_head.top_log_probs, want_head.top_log_probs, atol=tolerance)
    assert np.array_equal(got_head.top_ids, want_head.top_ids)


def test_selects_to_the_last_slot_read_merge_and_decode_as_the_cache_they_name(model, exported):
    """Selects that keep a self-attention cache's last slot (beam reorders, rows leaving): the
    device path leaves them to the next decoder call, which gathers and trims the past itself
    (export/device_decoder.py), and a select of such a cache composes with it. Read, merged or
    decoded, the cache is the one the selects name, on every backend."""
    cache = random_cache(model, rows=5, length=7, seed=15)
    first_rows, second_rows = np.array([4, 0, 2, 2]), np.array([3, 1, 0])
    expected = [array[first_rows][second_rows][:, :, 3:] for array in cache]  # 3 rows, 4 slots

    def selected():
        once = model.kv.select(model.kv.from_numpy(cache), first_rows, 2, 7)
        return model.kv.select(once, second_rows, 1, 5)

    for got, want in zip(model.kv.to_numpy(selected()), expected, strict=True):
        assert np.array_equal(got, want)
    other = random_cache(model, rows=2, length=2, seed=16)
    merged = model.kv.merge(selected(), model.kv.from_numpy(other), 5, left=True)
    for got, a, b in zip(model.kv.to_numpy(merged), expected, other, strict=True):
        assert np.array_equal(got[:3, :, 1:], a) and not got[:3, :, :1].any()
        assert np.array_equal(got[3:, :, 3:], b) and not got[3:, :, :3].any()

    reference = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    info = model.info
    rng = np.random.default_rng(17)
    src_ids = rng.integers(2, info.vocab_size - 1, (3, 5))
    src_mask = np.ones_like(src_ids)
    inputs = StepInputs.lockstep(
        rng.integers(2, info.vocab_size - 1, (3, 1)), 4, src_mask, top_k=3, pad_id=info.pad_id
    )
    want_head, want_present = reference.kv.decode(
        inputs, reference.kv.from_numpy(expected), reference.kv.encode(src_ids, src_mask)
    )
    head, present = model.kv.decode(inputs, selected(), model.kv.encode(src_ids, src_mask))
    tolerance = 1e-3 if model.provider == "cuda" else 1e-5
    for got, want in zip(
        model.kv.to_numpy(present), reference.kv.to_numpy(want_present), strict=True
    ):
        np.testing.assert_allclose(got, want, atol=tolerance)
    assert present.length == 5
    assert np.array_equal(head.top_ids, want_head.top_ids)


def test_host_caches_grow_in_place_until_their_spare_slots_run_out(exported):
    """Decoding from an empty cache: every step writes its keys into the same arrays, until
    SPARE_SLOTS steps filled them; the next step copies into arrays with spare slots again.
    Every step's grown cache equals the device backend's (which appends with Concat)."""
    host = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    device = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="device")
    info = host.info
    rows = 2
    rng = np.random.default_rng(7)
    src_ids = rng.integers(2, info.vocab_size - 1, (rows, 5))
    src_mask = np.ones_like(src_ids)
    caches = {
        model: (model.kv.empty(rows), model.kv.encode(src_ids, src_mask))
        for model in (host, device)
    }
    first_arrays = caches[host][0].tensors[0]
    tokens = np.full((rows, 1), info.decoder_start_id)
    for step in range(SPARE_SLOTS + 1):
        inputs = StepInputs.lockstep(tokens, step, src_mask, top_k=2, pad_id=info.pad_id)
        heads = {}
        for model, (past, cross) in list(caches.items()):
            heads[model], grown = model.kv.decode(inputs, past, cross)
            caches[model] = (grown, cross)
        host_cache = caches[host][0]
        assert host_cache.length == step + 1
        assert (host_cache.tensors[0] is first_arrays) == (step < SPARE_SLOTS)
        assert host_cache.tensors[0].shape[2] >= step + 1
        assert not host_cache.tensors[0][:, :, step + 1 :].any()  # spare slots stay zero
        for got, want in zip(
            host.kv.to_numpy(host_cache), device.kv.to_numpy(caches[device][0]), strict=True
        ):
            # equal up to float summation order (the host's attention also reads masked slots)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(heads[host].top_ids, heads[device].top_ids)
        tokens = heads[host].top_ids[:, :1]


def test_host_select_and_merge_keep_spare_slots_for_self_caches_only(exported):
    host = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    arrays = random_cache(host, rows=3, length=4, seed=8)
    for grows, spare in ((True, SPARE_SLOTS), (False, 0)):
        selected = host.kv.select(host.kv.from_numpy(arrays, grows), np.array([2, 0]), 1, 4)
        assert np.array_equal(host.kv.to_numpy(selected)[0], arrays[0][[2, 0]][:, :, 1:4])
        shapes = [(selected.length, selected.grows, selected.tensors[0].shape[2])]
        assert not selected.tensors[0][:, :, 3:].any()
        merged = host.kv.merge(host.kv.from_numpy(arrays, grows), selected, 5, left=grows)
        shapes.append((merged.length, merged.grows, merged.tensors[0].shape[2]))
        assert not merged.tensors[0][:, :, 5:].any()
        assert shapes == [(3, grows, 3 + spare), (5, grows, 5 + spare)]


def test_host_beam_reorder_moves_rows_in_place(exported):
    host = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    arrays = random_cache(host, rows=4, length=3, seed=9)
    cache = host.kv.from_numpy(arrays)
    keys_0 = cache.tensors[0]
    rows = np.array([0, 0, 2, 3])  # row 1 continues row 0's beam
    reordered = host.kv.select(cache, rows, 0, 3)
    assert reordered.tensors[0] is keys_0
    assert np.array_equal(host.kv.to_numpy(reordered)[0], arrays[0][rows])


def test_host_retiring_rows_closes_the_gaps_in_place(exported):
    """Rows leaving with the others in order: the kept rows move down in their own buffers
    (a view of the first rows, no new buffer) and the spare slots stay zero."""
    host = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    arrays = random_cache(host, rows=6, length=3, seed=14)
    cache = host.kv.from_numpy(arrays)
    buffers = list(cache.tensors)
    allocated = host.kv.pool.allocated
    rows = np.array([0, 2, 3, 5])  # rows 1 and 4 finished
    kept = host.kv.select(cache, rows, 0, 3)
    assert host.kv.pool.allocated == allocated
    for value, buffer, expected in zip(kept.tensors, buffers, arrays, strict=True):
        assert np.shares_memory(value, buffer) and value.flags.c_contiguous
        assert value.shape[0] == 4 and np.array_equal(value[:, :, :3], expected[rows])
        assert not value[:, :, 3:].any()  # the spare slots
    assert kept.length == 3 and kept.grows


def test_host_beam_moves_while_rows_retire_stay_in_place(exported):
    """A step where a request finishes and another's beam continues a sibling's cache: the
    few moved rows are copied within the buffers (no new buffer), out of order included."""
    host = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    arrays = random_cache(host, rows=8, length=3, seed=21)
    cache = host.kv.from_numpy(arrays)
    buffers = list(cache.tensors)
    allocated = host.kv.pool.allocated
    rows = np.array([0, 1, 5, 3, 4, 5])  # rows 2 and 6, 7 leave; row 2 takes row 5's beam
    kept = host.kv.select(cache, rows, 0, 3)
    assert host.kv.pool.allocated == allocated
    for value, buffer, expected in zip(kept.tensors, buffers, arrays, strict=True):
        assert np.shares_memory(value, buffer)
        assert np.array_equal(value[:, :, :3], expected[rows])
        assert not value[:, :, 3:].any()  # the spare slots
    assert kept.length == 3


def test_a_consumed_cache_cannot_be_read(model):
    """select, merge and decode consume their input caches (the host reuses their buffers):
    touching one afterwards raises instead of reading whatever the buffer holds now."""
    cache = model.kv.from_numpy(random_cache(model, rows=3, length=4, seed=10))
    selected = model.kv.select(cache, np.array([1, 2]), 1, 4)
    with pytest.raises(RuntimeError, match="consumed"):
        model.kv.select(cache, np.array([0]), 0, 4)
    with pytest.raises(RuntimeError, match="consumed"):
        model.kv.to_numpy(cache)
    other = model.kv.from_numpy(random_cache(model, rows=1, length=2, seed=11))
    model.kv.merge(selected, other, 3, left=True)
    for consumed in (selected, other):
        with pytest.raises(RuntimeError, match="consumed"):
            model.kv.to_numpy(consumed)


def test_host_reuses_the_buffers_of_consumed_caches_without_mixing_them(exported):
    """Buffers of caches that were selected away or grew come back for new caches: a reused
    buffer holds exactly its new cache's values, and the caches alive stay intact."""
    host = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    pool = host.kv.pool
    first = random_cache(host, rows=4, length=6, seed=12)
    second = random_cache(host, rows=4, length=6, seed=13)
    kept = host.kv.from_numpy(first)
    held_view = kept.tensors[0][:, :, :2]  # a caller still sees this buffer: never reused
    gone = host.kv.from_numpy(second)
    trimmed = host.kv.select(gone, np.array([3, 1, 0]), 2, 6)  # gone's buffers are free now
    reused_before = pool.reused
    fresh = host.kv.from_numpy(second)
    assert pool.reused > reused_before  # from gone's buffers
    for array in fresh.tensors:
        assert not any(np.shares_memory(array, other) for other in kept.tensors)
        assert not any(np.shares_memory(array, other) for other in trimmed.tensors)
    np.testing.assert_array_equal(host.kv.to_numpy(kept)[0], first[0])
    np.testing.assert_array_equal(host.kv.to_numpy(fresh)[-1], second[-1])
    np.testing.assert_array_equal(host.kv.to_numpy(trimmed)[-1], second[-1][[3, 1, 0]][:, :, 2:6])
    assert not fresh.tensors[0][:, :, 6:].any()  # the spare slots of a reused buffer are zeroed

    kept_tensors = kept.tensors
    host.kv.select(kept, np.array([1, 0]), 0, 6)  # a gather into new buffers
    assert not any(np.shares_memory(buffer, held_view) for buffer in pool._free)
    assert any(np.shares_memory(buffer, kept_tensors[1]) for buffer in pool._free)


def test_releasing_free_memory_drops_the_pool_and_shrinks_the_arenas_of_its_calls(exported):
    """After start-up's calibration the host caches' free buffers are dropped and the calls
    given run with ONNX Runtime's arena shrinkage (service/runtime/onnx_model.py); the calls
    after them run with the default options again, and compute the same."""
    host = OnnxSeq2Seq(exported.onnx_dir, provider="cpu", kv_backend="host")
    cache = random_cache(host, rows=4, length=6, seed=14)
    host.kv.select(host.kv.from_numpy(cache), np.array([1, 0]), 0, 6)  # frees a cache
    assert host.kv.pool.free_bytes > 0
    ids = np.array([[5, 6, 7, 2]])
    before = host.kv.to_numpy(host.kv.encode(ids, np.ones_like(ids)))
    seen = []

    def calls():
        assert host.kv.pool.free_bytes == 0
        seen.append(host.run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage"))
        return host.kv.encode(ids, np.ones_like(ids))

    host.release_free_memory(calls)
    assert seen == ["cpu:0"] and host.run_options is None
    after = host.kv.to_numpy(host.kv.encode(ids, np.ones_like(ids)))
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old, new)
