"""The ONNX export: graph structure, names, and ORT against PyTorch."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.onnx_export import control_flow_ops, export_model
from export.verify import logits_errors, padded_source, verify
from tests.onnx_fixtures import random_step_feeds

TOLERANCE = 1e-4

pytest_plugins = ["tests.onnx_fixtures"]  # the session-scoped `exported` fixture


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_graphs_pass_checker_and_decoder_has_no_control_flow(exported):
    for name in (
        "encoder.onnx",
        "decoder.onnx",
        "decoder_device.onnx",
        "kv_select.onnx",
        "kv_merge.onnx",
        "kv_append.onnx",
    ):
        onnx.checker.check_model(str(exported.onnx_dir / name), full_check=True)
    decoder = onnx.load(exported.onnx_dir / "decoder.onnx")
    assert control_flow_ops(decoder) == set()
    assert {"If", "Loop", "Scan"}.isdisjoint(node.op_type for node in decoder.graph.node)


def test_encoder_returns_cross_keys_and_values_for_every_decoder_layer(exported):
    config = exported.model.config
    encoder = session(exported.onnx_dir / "encoder.onnx")
    layers = config.decoder_layers
    names = [output.name for output in encoder.get_outputs()]
    assert names[0] == "encoder_hidden_states"
    assert sorted(names[1:]) == sorted(
        [f"cross_key_{i}" for i in range(layers)] + [f"cross_value_{i}" for i in range(layers)]
    )
    assert len(names) == 1 + 2 * layers

    src_ids, src_mask = padded_source([6, 3], exported.model)
    outputs = dict(
        zip(
            names,
            encoder.run(None, {"input_ids": src_ids.numpy(), "attention_mask": src_mask.numpy()}),
            strict=True,
        )
    )
    with torch.no_grad():
        memory, cross_keys, cross_values = exported.model.encode(src_ids, src_mask)
    expected_shape = (2, config.decoder_heads, 6, config.decoder_head_dim)  # (B, H, S, Dh)
    np.testing.assert_allclose(outputs["encoder_hidden_states"], memory.numpy(), atol=TOLERANCE)
    for i in range(layers):
        assert outputs[f"cross_key_{i}"].shape == expected_shape
        np.testing.assert_allclose(outputs[f"cross_key_{i}"], cross_keys[i].numpy(), atol=TOLERANCE)
        np.testing.assert_allclose(
            outputs[f"cross_value_{i}"], cross_values[i].numpy(), atol=TOLERANCE
        )


def test_decoder_inputs_and_outputs_are_named_with_dynamic_dims(exported):
    layers = exported.model.config.decoder_layers
    decoder = session(exported.onnx_dir / "decoder.onnx")
    inputs = {i.name: i for i in decoder.get_inputs()}
    outputs = {o.name: o for o in decoder.get_outputs()}
    expected_inputs = {"input_ids", "positions", "self_attention_mask", "encoder_attention_mask"}
    for i in range(layers):
        expected_inputs |= {
            f"past_key_{i}",
            f"past_value_{i}",
            f"cross_key_{i}",
            f"cross_value_{i}",
        }
    expected_inputs |= {"top_k", "banned_ids", "watch_ids"}  # the search head
    assert set(inputs) == expected_inputs
    assert set(outputs) == {
        "logits",
        "top_log_probs",
        "top_ids",
        "watch_log_probs",
    } | {f"new_{kind}_{i}" for kind in ("key", "value") for i in range(layers)}
    for name in ("input_ids", "positions", "self_attention_mask", "encoder_attention_mask"):
        assert inputs[name].type == "tensor(int64)"
        assert isinstance(inputs[name].shape[0], str)  # B dynamic
    # one new token per row (a step graph); P+1 and S dynamic
    assert inputs["input_ids"].shape[1] == inputs["positions"].shape[1] == 1
    assert isinstance(inputs["self_attention_mask"].shape[1], str)
    assert isinstance(inputs["encoder_attention_mask"].shape[1], str)
    batch, _, past, _ = inputs["past_key_0"].shape
    assert isinstance(batch, str) and isinstance(past, str)


def test_ort_matches_pytorch_at_past_lengths_0_1_and_3_on_a_padded_batch(exported):
    """Also with masked junk in spare cache slots after the past (the host's caches)."""
    errors = logits_errors(exported.model, exported.onnx_dir, past_lengths=(0, 1, 3))
    assert {"logits_P0_T1", "logits_P1_T1", "logits_P3_T1"} <= set(errors)
    assert {"search_head_P0_T1", "search_head_P3_T1"} <= set(errors)
    assert {"logits_P0_T1_spare3", "new_kv_P3_T1_spare3", "search_head_P3_T1_spare3"} <= set(errors)
    assert max(errors.values()) <= TOLERANCE, errors


def test_first_step_with_empty_cache_and_batch_of_one_runs(exported):
    """Size-1 example inputs would have frozen dims to 1; check B=1 and B=4, P=0, S=1 and S=9."""
    config = exported.model.config
    decoder = session(exported.onnx_dir / "decoder.onnx")
    for batch, src_len in ((1, 1), (4, 9)):
        feeds = {
            "input_ids": np.full((batch, 1), config.decoder_start_id, dtype=np.int64),
            "positions": np.zeros((batch, 1), dtype=np.int64),
            "self_attention_mask": np.ones((batch, 1), dtype=np.int64),
            "encoder_attention_mask": np.ones((batch, src_len), dtype=np.int64),
        }
        for i in range(config.decoder_layers):
            empty = np.zeros((batch, config.decoder_heads, 0, config.decoder_head_dim), np.float32)
            cross = np.ones(
                (batch, config.decoder_heads, src_len, config.decoder_head_dim), np.float32
            )
            feeds |= {
                f"past_key_{i}": empty,
                f"past_value_{i}": empty,
                f"cross_key_{i}": cross,
                f"cross_value_{i}": cross,
            }
        feeds |= _head_feeds(batch, config.pad_id, 3)
        logits, new_keys = decoder.run(["logits", "new_key_0"], feeds)
        assert logits.shape == (batch, 1, config.tgt_vocab_size)
        assert new_keys.shape == (batch, config.decoder_heads, 1, config.decoder_head_dim)


def test_config_json_carries_ids_names_and_export_metadata(exported):
    config = json.loads((exported.onnx_dir / "config.json").read_text())
    model = exported.model.config
    assert config["special_ids"] == {
        "pad_id": model.pad_id,
        "eos_id": model.eos_id,
        "unk_id": model.unk_id,
        "decoder_start_id": model.decoder_start_id,
    }
    assert (config["num_layers"], config["num_heads"], config["head_dim"]) == (
        model.decoder_layers,
        model.decoder_heads,
        model.decoder_head_dim,
    )
    assert config["vocab_size"] == model.tgt_vocab_size
    assert config["opset"] == 20 and config["variant"] == "fp32"
    assert config["decoder"]["outputs"][0] == "logits"
    assert config["model"]["d_model"] == model.d_model


def test_verify_passes_on_the_export(exported):
    report = verify(exported.model, exported.onnx_dir)
    assert report.ok, report
    assert report.decodes == {"beam1": 1.0, "beam4": 1.0}


@pytest.mark.slow
def test_opset_23_export_also_matches_pytorch(exported, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_model(exported.model, tmp_path, opset=23)
    errors = logits_errors(exported.model, tmp_path, past_lengths=(0, 2))
    assert max(errors.values()) <= TOLERANCE, errors
    assert control_flow_ops(onnx.load(tmp_path / "decoder.onnx")) == set()


def test_search_head_bans_watches_and_ranks_like_the_numpy_mirror(exported):
    """The graph's head (log-softmax, per-row bans, top-k, watched ids before the bans) on the
    decoder's own logits equals tests/head_reference.py computed from those logits."""
    from tests.head_reference import head_from_logits

    config = exported.model.config
    decoder = session(exported.onnx_dir / "decoder.onnx")
    rows = 3
    feeds = random_step_feeds(config, rows, past=2, src=4, rng=np.random.default_rng(5))
    logits = decoder.run(["logits"], {**feeds, **_head_feeds(rows, config.pad_id, 1)})[0][:, -1]
    favourite = logits.argmax(axis=1)
    # Row 0 bans its favourite, row 1 two other ids, row 2 nothing but pad (repeated).
    bans = np.array([[config.pad_id, favourite[0]], [7, 9], [config.pad_id] * 2])
    watch = np.array([favourite[0], 7, 11])
    expected = head_from_logits(logits, 6, [config.pad_id], extra_bans=bans, watch_ids=watch)
    got = decoder.run(
        ["top_log_probs", "top_ids", "watch_log_probs"],
        {**feeds, "top_k": np.array([6]), "banned_ids": bans, "watch_ids": expected.watch_ids},
    )
    np.testing.assert_allclose(got[0], expected.top_log_probs, atol=1e-5)
    assert np.array_equal(got[1], expected.top_ids)
    assert favourite[0] not in got[1][0]  # banned in row 0, not in the others
    np.testing.assert_allclose(got[2], expected.watch_log_probs, atol=1e-5)
    assert np.isfinite(got[2]).all()  # watched before the bans: the favourite is watchable


def _head_feeds(rows: int, pad_id: int, top_k: int) -> dict[str, np.ndarray]:
    return {
        "top_k": np.array([top_k]),
        "banned_ids": np.full((rows, 1), pad_id),
        "watch_ids": np.full((rows, 1), pad_id),
    }


def test_fp16_conversion_keeps_one_node_per_name():
    """A second identical Cast (what the fp16 converter wrote into a torch 2.11 decoder) is
    dropped, a different node that reuses a name is renamed, and ONNX Runtime loads the result."""
    from onnx import TensorProto, helper

    from export.variants import drop_duplicate_nodes

    cast = helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT, name="x_cast_node")
    relu = helper.make_node("Relu", ["x32"], ["y"], name="x_cast_node")  # a taken name
    graph = helper.make_graph(
        [
            cast,
            helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT, name="x_cast_node"),
            relu,
        ],
        "duplicates",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    with pytest.raises(Exception, match="same node name"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    assert drop_duplicate_nodes(model) == 2
    assert [node.op_type for node in model.graph.node] == ["Cast", "Relu"]
    assert len({node.name for node in model.graph.node}) == 2
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([-1.5, 2.0], dtype=np.float16)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], [0.0, 2.0])
