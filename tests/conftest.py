"""Shared fixtures: small random Hugging Face Marian and M2M-100 checkpoints built offline."""

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


# The last LANGUAGE_CODES ids of TINY_M2M100's vocabulary stand for language codes, as NLLB's
# ~200 codes follow its SentencePiece pieces.
LANGUAGE_CODES = 4

TINY_M2M100 = dict(
    vocab_size=64,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    activation_function="relu",
    scale_embedding=True,
    # the fairseq dictionary's ids: <s>=0, <pad>=1, </s>=2, <unk>=3
    bos_token_id=0,
    pad_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=None,
    tie_word_embeddings=True,
    init_std=0.5,  # outputs that depend on the input, as for TINY_MARIAN
)


def build_random_m2m100(output_dir, seed: int = 2, eos_boost: float = 2.5, **overrides):
    """Save a random M2M100ForConditionalGeneration (one tied table, no logits bias) and
    return it. The </s> row of the table is scaled by ``eos_boost`` so that generations end
    at varied lengths: M2M-100 has no logits bias to favour it with."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    torch.manual_seed(seed)
    config = M2M100Config(**{**TINY_M2M100, **overrides})
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        table = model.get_input_embeddings().weight  # (V, D), shared with the LM head
        table[config.pad_token_id] = 0.0
        table[config.eos_token_id] *= eos_boost
    model.save_pretrained(output_dir)
    return model


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory):
    """A random Marian checkpoint with an untied LM head."""
    path = tmp_path_factory.mktemp("marian_untied")
    build_random_marian(path, tie_word_embeddings=False)
    return path
