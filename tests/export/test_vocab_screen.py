"""The exact int8 screen of greedy steps (export/vocab_screen.py): its error bound, and the
screened decoder against the same decoder without it (and against PyTorch's greedy search)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export.device_decoder import write_device_decoder
from export.onnx_export import control_flow_ops
from export.variants import make_int8
from export.verify import decode_agreement
from export.vocab_screen import (
    SCREEN_INPUT,
    add_vocab_screen,
    has_vocab_screen,
    quantized_rows,
    strip_vocab_screen,
)
from service.runtime.contract import DECODER_FILE
from service.runtime.engine import Engine
from tests.onnx_fixtures import random_step_feeds

pytest_plugins = ["tests.onnx_fixtures"]  # the session-scoped `exported` fixture

HEAD_OUTPUTS = ["logits", "top_log_probs", "top_ids", "watch_log_probs"]


def dynamic_quantize(hidden: np.ndarray) -> tuple[np.ndarray, float, int]:
    """ONNX DynamicQuantizeLinear (uint8): the range includes 0, round half to even."""
    low, high = min(0.0, float(hidden.min())), max(0.0, float(hidden.max()))
    scale = (high - low) / 255 if high > low else 1.0
    zero = int(np.clip(np.rint(-low / scale), 0, 255))
    return np.clip(np.rint(hidden / scale) + zero, 0, 255).astype(np.int64), scale, zero


def test_the_bound_holds_for_rows_and_hidden_states_with_outliers():
    rng = np.random.default_rng(0)
    vocab, dim = 400, 64
    rows = (rng.standard_normal((vocab, dim)) * 0.05).astype(np.float32)
    rows[::7, 3] *= 40  # outlier weights: coarse scales in those rows
    rows[5] = 0  # an all-zero row
    quantized, scales, hidden_coefficient, quantized_coefficient = quantized_rows(rows)
    assert quantized.dtype == np.int8 and np.abs(quantized.astype(int)).max() <= 63
    worst = 0.0
    for trial in range(200):
        hidden = rng.standard_normal((3, dim)).astype(np.float32)
        hidden[:, trial % dim] *= 1 + trial % 30  # an outlier feature, as transformers have
        hidden_q, hidden_scale, zero = dynamic_quantize(hidden)
        integer = (hidden_q - zero) @ quantized.astype(np.int64).T  # exact, (3, V)
        approx = integer * scales[None, :].astype(np.float64) * hidden_scale
        exact = hidden.astype(np.float64) @ rows.astype(np.float64).T
        dequantized = (hidden_q - zero) * hidden_scale
        hidden_norm = np.linalg.norm(hidden, axis=1, keepdims=True)
        error_norm = np.linalg.norm(hidden - dequantized, axis=1, keepdims=True)
        bound = hidden_norm * hidden_coefficient + error_norm * quantized_coefficient
        assert (np.abs(exact - approx) <= bound).all()
        ratio = np.abs(exact - approx)[:, bound[0] > 0] / bound[:, bound[0] > 0]
        worst = max(worst, float(ratio.max()))
    assert worst > 0.05  # the bound is not vacuous: errors reach a sizeable part of it


def saturating_u8s8(hidden_q: np.ndarray, quantized: np.ndarray) -> np.ndarray:
    """What ONNX Runtime's u8s8 kernels compute on AVX2 without VNNI: ``vpmaddubsw`` adds each
    pair of adjacent uint8 x int8 products in int16 with saturation, then ``vpmaddwd`` sums the
    pairs in int32. hidden_q (N, D) uint8 values, quantized (V, D) int8 -> (N, V)."""
    products = hidden_q[:, None, :].astype(np.int64) * quantized[None, :, :].astype(np.int64)
    pairs = products[..., 0::2] + products[..., 1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=-1)


def test_no_pair_sum_saturates_on_cpus_without_vnni():
    # Rows whose two largest weights sit side by side with one sign, against a hidden state at
    # the top of uint8's range: the worst case for an int16 pair sum. With 8-bit weights
    # (255 * 127 * 2 = 64770) the AVX2 kernel's answer differs from the exact one.
    rng = np.random.default_rng(1)
    vocab, dim = 64, 32
    rows = (rng.standard_normal((vocab, dim)) * 0.05).astype(np.float32)
    rows[:, 4] = rows[:, 5] = 1.0
    rows[::2, 4] = rows[::2, 5] = -1.0
    quantized, *_ = quantized_rows(rows)
    hidden_q = np.full((2, dim), 255, np.int64)
    hidden_q[1, ::3] = 0
    exact = hidden_q @ quantized.astype(np.int64).T
    assert (saturating_u8s8(hidden_q, quantized) == exact).all()


# --- the screened decoder ----------------------------------------------------------------


def screened_copy(exported, directory, candidates: int):
    """The tiny export with a screen of ``candidates`` ids for steps of up to 16 rows (its
    vocabulary is below the size the exporter screens by default)."""
    shutil.copytree(exported.onnx_dir, directory)
    decoder = onnx.load(directory / DECODER_FILE)
    assert not has_vocab_screen(decoder)
    assert add_vocab_screen(decoder, candidates=candidates, max_rows=16) == candidates
    onnx.save(decoder, directory / DECODER_FILE)
    write_device_decoder(directory, exported.model.config.decoder_layers)  # as the exporter
    return directory


@pytest.fixture(scope="module")
def screened_dirs(exported, tmp_path_factory):
    base = tmp_path_factory.mktemp("screened")
    # 24 of 96 ids: most greedy steps of this model are covered; 2: the check fails (bans)
    return {k: screened_copy(exported, base / f"k{k}", k) for k in (24, 2)}


def step_feeds(config, rows: int, seed: int) -> dict[str, np.ndarray]:
    return random_step_feeds(config, rows, past=3, src=5, rng=np.random.default_rng(seed))


def run(session, feeds, top_k, bans, watch, screen):
    return session.run(
        HEAD_OUTPUTS,
        {
            **feeds,
            "top_k": np.array([top_k]),
            "banned_ids": bans,
            "watch_ids": watch,
            SCREEN_INPUT: np.array(screen),
        },
    )


def answered_by_screen(screened: list, full: list) -> bool:
    """Whether the screen answered a step: its ``logits`` output is then the int8
    approximation (the full head's, in a fallback, differs from the plain graph's in the last
    bits only: a subgraph's kernels sum in another order)."""
    return bool(np.abs(screened[0] - full[0]).max() > 1e-3)


def test_a_covered_greedy_step_gives_the_full_heads_ids_and_row_shifted_log_probs(
    exported, screened_dirs
):
    config = exported.model.config
    session = ort.InferenceSession(str(screened_dirs[24] / DECODER_FILE))
    answered = 0
    for seed in range(8):
        rows = 4
        feeds = step_feeds(config, rows, seed)
        watch = np.tile([0, 7, 11], (rows, 1))
        plain_bans = np.full((rows, 1), config.pad_id)
        full = run(session, feeds, 1, plain_bans, watch, screen=False)
        favourite = full[2][:, 0]
        # Row 0 bans its favourite (the head must find the next one), the others pad only.
        bans = np.stack([np.full(rows, config.pad_id), np.full(rows, config.pad_id)], axis=1)
        bans[0, 1] = favourite[0]
        watch[0, 1] = favourite[0]  # watched before the bans, as the engine does
        full = run(session, feeds, 1, bans, watch, screen=False)
        screened = run(session, feeds, 1, bans, watch, screen=True)
        assert np.array_equal(screened[2], full[2])  # top ids
        assert screened[2][0, 0] != favourite[0]
        # Log-probs: the same up to one constant per row (the approximate normaliser).
        shift = screened[1][:, :1] - full[1][:, :1]  # (rows, 1)
        np.testing.assert_allclose(screened[3] - full[3], np.tile(shift, (1, 3)), atol=1e-5)
        # logits: the screen's approximations, within a small error of the exact ones
        assert np.abs(screened[0] - full[0]).max() < 0.05 * np.abs(full[0]).max()
        answered += answered_by_screen(screened, full)
    assert answered >= 6  # the screen answered (not its fallback, the full head)


def test_steps_the_screen_cannot_cover_or_must_not_touch_give_the_full_heads_output(
    exported, screened_dirs
):
    config = exported.model.config
    cases = ((2, 1, 2, 3), (24, 2, 1, 3), (24, 8, 1, 3), (24, 1, 1, 20))
    for candidates, top_k, bans_per_row, rows in cases:
        session = ort.InferenceSession(str(screened_dirs[candidates] / DECODER_FILE))
        feeds = step_feeds(config, rows, seed=candidates + top_k)
        bans = np.full((rows, bans_per_row), config.pad_id)
        watch = np.tile([0, 5], (rows, 1))
        full = run(session, feeds, top_k, bans, watch, screen=False)
        screened = run(session, feeds, top_k, bans, watch, screen=True)
        # top_k + bans > K (falls back), beam search's top k (never screened), or more rows
        # than the screen takes: identical
        for got, expected in zip(screened, full, strict=True):
            assert np.array_equal(got, expected)


def test_stripping_the_screen_restores_the_plain_decoder(exported, screened_dirs, tmp_path):
    decoder = onnx.load(screened_dirs[24] / DECODER_FILE)
    assert control_flow_ops(decoder) == {"If"}
    assert strip_vocab_screen(decoder) and not has_vocab_screen(decoder)
    assert control_flow_ops(decoder) == set()
    onnx.checker.check_model(decoder)
    onnx.save(decoder, tmp_path / "stripped.onnx")
    stripped = ort.InferenceSession(str(tmp_path / "stripped.onnx"))
    plain = ort.InferenceSession(str(exported.onnx_dir / DECODER_FILE))
    config = exported.model.config
    feeds = step_feeds(config, 2, seed=3)
    head = {
        "top_k": np.array([3]),
        "banned_ids": np.full((2, 1), config.pad_id),
        "watch_ids": np.tile([0, 5], (2, 1)),
    }
    for got, expected in zip(
        stripped.run(HEAD_OUTPUTS, {**feeds, **head}),
        plain.run(HEAD_OUTPUTS, {**feeds, **head}),
        strict=True,
    ):
        assert np.array_equal(got, expected)


def test_greedy_decoding_is_pytorchs_with_the_screen_and_the_same_without(exported, screened_dirs):
    for directory in screened_dirs.values():
        agreement = decode_agreement(
            exported.model, directory, [12, 4, 8, 10, 6, 9, 7, 11], beam_sizes=(1,)
        )
        assert agreement["beam1"] == 1.0, agreement
    sources = [[5 + (3 * i + j) % 80 for j in range(4 + i % 9)] + [0] for i in range(12)]
    copy_tokens = [{7: 1, 9: 2} if i % 3 == 0 else None for i in range(12)]
    outputs = []
    for screen, backend in ((True, "host"), (False, "host"), (True, "device")):
        engine = Engine.from_dir(
            screened_dirs[24], provider="cpu", kv_backend=backend, vocab_screen=screen
        )
        assert engine.model.vocab_screen_feed == np.array(screen)
        outputs.append(engine.translate_ids(sources, max_new_tokens=20, copy_tokens=copy_tokens))
    assert outputs[0] == outputs[1] == outputs[2]
    assert sum(map(len, outputs[0])) > 0


def test_the_int8_variant_is_made_from_the_plain_decoder(screened_dirs, tmp_path):
    target = make_int8(screened_dirs[24], tmp_path / "int8")
    decoder = onnx.load(target / DECODER_FILE)
    assert not has_vocab_screen(decoder) and control_flow_ops(decoder) == set()
    engine = Engine.from_dir(target, provider="cpu")
    assert engine.model.vocab_screen_feed is None
    assert engine.translate_ids([[5, 6, 7, 0]], max_new_tokens=5)[0] is not None


def projection_graph(rows: np.ndarray, bias: np.ndarray) -> onnx.ModelProto:
    """hidden (N, 1, D) -> logits (N, 1, V) = hidden @ rows.T + bias, with the search head."""
    from onnx import TensorProto, helper, numpy_helper

    from export.search_head import add_search_head

    vocab, dim = rows.shape
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["rows"], ["rows_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["hidden", "rows_t"], ["product"]),
            helper.make_node("Add", ["product", "bias"], ["logits"]),
        ],
        "projection",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", 1, dim])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, vocab])],
        [numpy_helper.from_array(rows, "rows"), numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    add_search_head(model)
    return model


def test_ids_that_int8_cannot_tell_apart_are_decided_exactly():
    """Groups of 40 rows equal in int8 (they differ below its resolution) and K = 16: the
    screen cannot see which of a group is best, so it must fall back whenever the best group
    is the one that matters, and may answer alone only when the bound proves it right."""
    rng = np.random.default_rng(4)
    dim, groups, size = 16, 12, 40
    centres = rng.standard_normal((groups, dim)).astype(np.float32)
    rows = np.repeat(centres, size, axis=0)
    rows += rng.standard_normal(rows.shape).astype(np.float32) * 1e-4  # below int8's step
    bias = (rng.standard_normal(len(rows)) * 1e-4).astype(np.float32)
    model = projection_graph(rows, bias)
    plain = ort.InferenceSession(model.SerializeToString())
    add_vocab_screen(model, candidates=16)
    screened = ort.InferenceSession(model.SerializeToString())
    covered = 0
    for trial in range(60):
        batch = 1 + trial % 3
        hidden = rng.standard_normal((batch, 1, dim)).astype(np.float32)
        if trial % 2:  # another group's rows as the hidden state: a clear winner group
            hidden[:, 0] = centres[trial % groups] * 3
        feeds = {
            "hidden": hidden,
            "top_k": np.array([1]),
            "banned_ids": np.full((batch, 1), len(rows) - 1),
            "watch_ids": np.tile([0, 41], (batch, 1)),
        }
        full = plain.run(HEAD_OUTPUTS, feeds)
        got = screened.run(HEAD_OUTPUTS, {**feeds, SCREEN_INPUT: np.array(True)})
        assert np.array_equal(got[2], full[2]), trial
        covered += answered_by_screen(got, full)
    assert covered == 0  # 40 int8-equal candidates never fit in 16: always the full head


def test_the_exporter_screens_large_vocabularies_only(exported, tmp_path, monkeypatch):
    """MIN_VOCAB lowered to the tiny model's 96 ids: the export gets the screen and says so.
    Torch's graphs of the model are the fixture's: the screen is added after them."""
    import export.onnx_export as onnx_export

    monkeypatch.setattr(onnx_export, "MIN_VOCAB", 96)
    monkeypatch.setattr(onnx_export, "export_graph", exported.replay_graph)
    for screen in (True, False):
        target = tmp_path / f"screen-{screen}"
        onnx_export.export_model(exported.model, target, vocab_screen=screen)
        config = json.loads((target / "config.json").read_text())
        assert has_vocab_screen(onnx.load(target / DECODER_FILE)) == screen
        assert ("vocab_screen" in config) == screen
    screened = json.loads((tmp_path / "screen-True" / "config.json").read_text())
    assert screened["vocab_screen"] == {"candidates": 95, "max_rows": 128}  # K = min(128, V - 1)


def test_the_service_setting_turns_the_screen_off(screened_dirs):
    from service.config import Settings
    from service.translation.exports import ModelSpec
    from service.wiring import engine_loader

    spec = ModelSpec("tiny", screened_dirs[24], "en", "de")
    for enabled in (True, False):
        engine = engine_loader(Settings(vocab_screen=enabled, provider="cpu"))(spec)
        assert engine.model.vocab_screen_feed == np.array(enabled)
