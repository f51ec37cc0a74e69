"""The ONNX export of an M2M-100 / NLLB checkpoint, against transformers and against PyTorch.

The decoder graph takes ``positions`` as each row's count of earlier target tokens (as for
Marian); fairseq's offset (pad_id + 1) is inside the graph, so the runtime feeds the same
numbers for both architectures."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.onnx_export import export_from_dir
from export.verify import verify
from models.checkpoint import load_pretrained
from tests.conftest import build_random_m2m100
from tests.models.test_model_m2m100_parity import FIRST_CODE, VOCAB, fairseq_source

TOLERANCE = 1e-4  # ORT's fused kernels sum in another order than PyTorch


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(transformers model, our PyTorch model, ONNX dir), exported straight from the Hugging
    Face directory as ``python -m export --model DIR`` does."""
    hf_dir = tmp_path_factory.mktemp("m2m100_hf")
    hf_model = build_random_m2m100(hf_dir)
    onnx_dir = tmp_path_factory.mktemp("m2m100_onnx") / "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_from_dir(hf_dir, onnx_dir)
    return hf_model, load_pretrained(hf_dir), onnx_dir


def test_onnx_logits_match_transformers_token_by_token(exported):
    hf_model, ours, onnx_dir = exported
    config = ours.config
    cpu = ["CPUExecutionProvider"]
    encoder = ort.InferenceSession(str(onnx_dir / "encoder.onnx"), providers=cpu)
    decoder = ort.InferenceSession(str(onnx_dir / "decoder.onnx"), providers=cpu)
    src_ids, src_mask = fairseq_source([9, 5, 7])
    generator = torch.Generator().manual_seed(2)
    tgt_ids = torch.randint(4, VOCAB, (3, 6), generator=generator)
    tgt_ids[:, 0] = config.decoder_start_id
    tgt_ids[:, 1] = FIRST_CODE + torch.arange(3)  # the forced target-language codes
    with torch.no_grad():
        expected_memory = hf_model.get_encoder()(
            input_ids=src_ids, attention_mask=src_mask
        ).last_hidden_state  # (B, S, D)
        expected = hf_model(
            input_ids=src_ids, attention_mask=src_mask, decoder_input_ids=tgt_ids
        ).logits  # (B, T, V)

    encoded = dict(
        zip(
            [o.name for o in encoder.get_outputs()],
            encoder.run(None, {"input_ids": src_ids.numpy(), "attention_mask": src_mask.numpy()}),
            strict=True,
        )
    )
    keep = src_mask.bool().numpy()
    np.testing.assert_allclose(
        encoded["encoder_hidden_states"][keep], expected_memory.numpy()[keep], atol=TOLERANCE
    )

    layers, heads, head_dim = config.decoder_layers, config.decoder_heads, config.decoder_head_dim
    cache = {
        f"past_{kind}_{i}": np.zeros((3, heads, 0, head_dim), dtype=np.float32)
        for kind in ("key", "value")
        for i in range(layers)
    }
    out_names = [o.name for o in decoder.get_outputs()]
    for step in range(tgt_ids.shape[1]):
        feeds = {
            "input_ids": tgt_ids[:, step : step + 1].numpy(),
            "positions": np.full((3, 1), step, dtype=np.int64),  # earlier target tokens
            "self_attention_mask": np.ones((3, step + 1), dtype=np.int64),
            "encoder_attention_mask": src_mask.numpy(),
            "top_k": np.array([4], dtype=np.int64),
            "banned_ids": np.full((3, 1), config.pad_id, dtype=np.int64),
            "watch_ids": np.full((3, 1), config.pad_id, dtype=np.int64),
            **cache,
        }
        for i in range(layers):
            feeds[f"cross_key_{i}"] = encoded[f"cross_key_{i}"]
            feeds[f"cross_value_{i}"] = encoded[f"cross_value_{i}"]
        got = dict(zip(out_names, decoder.run(None, feeds), strict=True))
        np.testing.assert_allclose(
            got["logits"][:, 0], expected[:, step].numpy(), atol=TOLERANCE, err_msg=f"step {step}"
        )
        for name in list(cache):
            new = got[name.replace("past_", "new_")]  # (B, H, 1, Dh)
            cache[name] = np.concatenate([cache[name], new], axis=2)


def test_verify_against_pytorch_and_engine_decodes(exported):
    """export.verify: ORT against PyTorch at several past lengths with a row that joined late
    (its positions count only its own tokens), and the engine's greedy and beam-4 decodes
    token-identical to models.search."""
    _, ours, onnx_dir = exported
    report = verify(ours, onnx_dir)
    assert report.ok, (report.checks, report.errors, report.decodes)
    assert max(report.errors.values()) <= TOLERANCE
