"""Shared fixtures: small random Hugging Face Marian checkpoints built offline."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EOS_BIAS = 9.0

TINY_MARIAN = dict(
    vocab_size=96,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=128,
    activation_function="swish",
    scale_embedding=True,
    pad_token_id=95,
    eos_token_id=0,
    decoder_start_token_id=95,
    forced_eos_token_id=None,
    # A larger init than the default 0.02 makes outputs depend on the input (docs/toolchain.md).
    init_std=0.5,
)


def build_random_marian(output_dir, seed: int = 0, **overrides):
    """Save a random MarianMTModel (untied LM head, non-zero logits bias) and return it."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    config = MarianConfig(**{**TINY_MARIAN, **overrides})
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        # Favour eos, so that hypotheses end at varied lengths and finished beams compete.
        bias = torch.randn_like(model.final_logits_bias)
        bias[0, config.eos_token_id] += EOS_BIAS
        model.final_logits_bias.copy_(bias)
    model.save_pretrained(output_dir)
    return model


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory):
    """A random Marian checkpoint with an untied LM head."""
    path = tmp_path_factory.mktemp("marian_untied")
    build_random_marian(path, tie_word_embeddings=False)
    return path
