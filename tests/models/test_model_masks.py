"""The transformer's masks and KV cache, pinned on a small random pre-norm model of our own."""

from __future__ import annotations

import pytest
import torch

from models.config import TransformerConfig
from models.transformer import Transformer


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=50, tgt_vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_heads=4, decoder_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        normalize_before=True, activation="gelu", pad_id=49, eos_id=0, decoder_start_id=49,
    )  # fmt: skip
    return Transformer(config).eval()


def source_batch() -> tuple[torch.Tensor, torch.Tensor]:
    src_ids = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 0, 49, 49]])
    src_mask = (src_ids != 49).long()
    return src_ids, src_mask


@torch.no_grad()
def test_incremental_decoding_equals_full_sequence_decoding(model):
    src_ids, src_mask = source_batch()
    tgt_ids = torch.tensor([[49, 3, 4, 5, 6, 7], [49, 8, 9, 10, 11, 12]])
    full_logits = model(src_ids, src_mask, tgt_ids)  # (B, T, V)

    _, cross_keys, cross_values = model.encode(src_ids, src_mask)
    past_keys, past_values = model.empty_cache(2)
    for step in range(tgt_ids.shape[1]):
        positions = torch.full((2, 1), step)
        logits, past_keys, past_values = model.decode_step(
            tgt_ids[:, step : step + 1],
            positions,
            past_keys,
            past_values,
            cross_keys,
            cross_values,
            src_mask,
        )
        assert past_keys[0].shape == (2, 4, step + 1, 8)
        torch.testing.assert_close(logits[:, 0], full_logits[:, step], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_padding_in_one_row_does_not_change_another_row(model):
    src_ids, src_mask = source_batch()
    tgt_ids = torch.tensor([[49, 3, 4], [49, 8, 9]])
    batched = model(src_ids, src_mask, tgt_ids)
    # Row 1 alone, without the padding that row 0's length forced on it.
    alone = model(src_ids[1:, :3], src_mask[1:, :3], tgt_ids[1:])
    torch.testing.assert_close(batched[1:], alone, atol=1e-5, rtol=1e-5)
    # Changing what sits under the padding changes nothing.
    garbage = src_ids.clone()
    garbage[1, 3:] = 17
    torch.testing.assert_close(model(garbage, src_mask, tgt_ids), batched, atol=1e-6, rtol=1e-6)


@torch.no_grad()
def test_later_target_token_does_not_change_earlier_logits(model):
    src_ids, src_mask = source_batch()
    tgt_ids = torch.tensor([[49, 3, 4, 5], [49, 8, 9, 10]])
    changed = tgt_ids.clone()
    changed[:, 3] = 22
    original_logits, changed_logits = (
        model(src_ids, src_mask, tgt_ids),
        model(src_ids, src_mask, changed),
    )
    torch.testing.assert_close(original_logits[:, :3], changed_logits[:, :3], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(original_logits[:, 3], changed_logits[:, 3])


@torch.no_grad()
def test_invalid_cache_slots_are_ignored(model):
    """A row that joins a running batch late has masked cache slots on the left: it must decode
    as if alone, whatever those slots hold."""
    src_ids, src_mask = source_batch()
    _, cross_keys, cross_values = model.encode(src_ids[:1], src_mask[:1])
    tokens = torch.tensor([[49]])
    alone, _, _ = model.decode_step(tokens, torch.zeros(1, 1, dtype=torch.long), *model.empty_cache(1),
                                    cross_keys, cross_values, src_mask[:1])  # fmt: skip
    junk_keys = tuple(torch.randn(1, 4, 3, 8) for _ in range(2))
    junk_values = tuple(torch.randn(1, 4, 3, 8) for _ in range(2))
    self_mask = torch.tensor([[0, 0, 0, 1]])
    late, present_keys, _ = model.decode_step(tokens, torch.zeros(1, 1, dtype=torch.long), junk_keys, junk_values,
                                              cross_keys, cross_values, src_mask[:1], self_mask)  # fmt: skip
    assert present_keys[0].shape == (1, 4, 4, 8)
    torch.testing.assert_close(late, alone, atol=1e-5, rtol=1e-5)


def test_attention_scales_by_head_size():
    """1/sqrt(Dh): with identical keys the output is the mean of values whatever the scale, so
    check against a hand computation instead."""
    torch.manual_seed(1)
    from models.transformer import MultiHeadAttention

    attention = MultiHeadAttention(d_model=8, num_heads=2, dropout=0.0).eval()
    x = torch.randn(1, 3, 8)
    keys, values = attention.project_keys_values(x)  # (1, 2, 3, 4)
    queries = attention.split_heads(attention.q_proj(x))
    weights = torch.softmax(queries @ keys.transpose(-1, -2) / 4**0.5, dim=-1)  # Dh = 4
    expected = attention.out_proj((weights @ values).transpose(1, 2).reshape(1, 3, 8))
    actual = attention(x, keys, values, torch.zeros(1, 1, 3, 3))
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-6)
