"""The device decoder (export/device_decoder.py): the decoder graph that gathers and trims its
past inside the call and returns the grown cache, written beside every variant's decoder."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort

from export.device_decoder import write_device_decoder
from export.onnx_export import save_onnx
from export.variants import make_fp16
from service.runtime.contract import new_names, past_names, present_names
from tests.onnx_fixtures import random_step_feeds

pytest_plugins = ["tests.onnx_fixtures"]  # the session-scoped `exported` fixture


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def device_and_plain_steps(onnx_dir, config) -> tuple[list, list]:
    """One step of each graph: the device decoder on a cache of 5 rows and 6 slots with rows
    [3, 3, 0, 4] and slots 2: taken; the plain decoder on that cache gathered in numpy."""
    layers = config.decoder_layers
    rows, start = np.array([3, 3, 0, 4]), 2
    feeds = random_step_feeds(config, 4, past=4, src=5, rng=np.random.default_rng(3))
    rng = np.random.default_rng(4)
    shape = (5, config.decoder_heads, 6, config.decoder_head_dim)
    cache = {name: rng.standard_normal(shape).astype(np.float32) for name in past_names(layers)}
    head = {
        "top_k": np.array([3]),
        "banned_ids": np.full((4, 1), config.pad_id),
        "watch_ids": np.full((4, 1), config.pad_id),
    }
    wanted = ["top_log_probs", "top_ids"]
    plain_feeds = {
        name: np.ascontiguousarray(value[rows][:, :, start:]) for name, value in cache.items()
    }
    plain = session(onnx_dir / "decoder.onnx").run(
        wanted + new_names(layers), {**feeds, **head, **plain_feeds}
    )
    device = session(onnx_dir / "decoder_device.onnx").run(
        wanted + present_names(layers),
        {**feeds, **head, **cache, "past_rows": rows, "past_start": np.array([start])},
    )
    expected = plain[:2] + [
        np.concatenate([plain_feeds[name], new], axis=2)
        for name, new in zip(past_names(layers), plain[2:], strict=True)
    ]
    return device, expected


def test_the_device_decoder_is_the_decoder_on_its_gathered_past_with_the_new_keys_after(
    exported,
):
    device, expected = device_and_plain_steps(exported.onnx_dir, exported.model.config)
    for got, want in zip(device, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)  # the same kernels on the same values


def test_a_decoder_with_external_weights_shares_them_with_its_device_decoder(exported, tmp_path):
    decoder = onnx.load(exported.onnx_dir / "decoder.onnx")
    save_onnx(decoder, tmp_path / "decoder.onnx", external_data=True)
    write_device_decoder(tmp_path, exported.model.config.decoder_layers)
    files = {}
    for name in ("decoder.onnx", "decoder_device.onnx"):
        graph = onnx.load(tmp_path / name, load_external_data=False).graph
        files[name] = sorted(
            (tensor.name, entry.value)
            for tensor in graph.initializer
            if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data
        )
    assert files["decoder.onnx"] and files["decoder_device.onnx"] == files["decoder.onnx"]
    assert not list(tmp_path.glob("decoder_device.onnx.*"))
    device, expected = device_and_plain_steps(tmp_path, exported.model.config)
    for got, want in zip(device, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_fp16_variant_has_a_device_decoder_with_fp16_caches(exported, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = make_fp16(exported.onnx_dir, tmp_path / "fp16")
    graph = onnx.load(target / "decoder_device.onnx").graph
    layers = exported.model.config.decoder_layers
    types = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    types |= {value.name: value.type.tensor_type.elem_type for value in graph.output}
    for name in past_names(layers) + present_names(layers):
        assert types[name] == onnx.TensorProto.FLOAT16
    assert types["past_rows"] == types["past_start"] == onnx.TensorProto.INT64
    assert types["top_log_probs"] == onnx.TensorProto.FLOAT  # the search head stays fp32
