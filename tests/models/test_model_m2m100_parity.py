"""Our transformer, imported from an M2M-100 / NLLB checkpoint, against Hugging Face transformers
(the independent reference): encoder output, logits, and greedy generation with the forced
target-language first token."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

from models.checkpoint import load_pretrained, save_pretrained
from models.search import greedy_search
from models.transformer import fairseq_positions
from tests.conftest import LANGUAGE_CODES, TINY_M2M100, build_random_m2m100

TOLERANCE = 1e-5
VOCAB = TINY_M2M100["vocab_size"]
PAD, EOS = TINY_M2M100["pad_token_id"], TINY_M2M100["eos_token_id"]
FIRST_CODE = VOCAB - LANGUAGE_CODES  # ids FIRST_CODE.. stand for language codes


def fairseq_source(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """M2M-100 sources (B, S): ``[src_lang_code, tokens…, </s>]``, right-padded with <pad>,
    and their mask."""
    generator = torch.Generator().manual_seed(seed)
    src_ids = torch.full((len(lengths), max(lengths)), PAD)
    src_mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        src_ids[row, 0] = FIRST_CODE + row % LANGUAGE_CODES
        src_ids[row, 1 : length - 1] = torch.randint(
            4, FIRST_CODE, (length - 2,), generator=generator
        )
        src_ids[row, length - 1] = EOS
        src_mask[row, :length] = 1
    return src_ids, src_mask


@pytest.fixture(scope="module")
def model_pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("m2m100")
    hf_model = build_random_m2m100(path)
    return hf_model, load_pretrained(path)


def test_import_reads_the_m2m100_layout(model_pair):
    _, ours = model_pair
    config = ours.config
    assert config.normalize_before and config.positions == "fairseq"
    assert config.activation == "relu" and not config.final_logits_bias
    assert config.share_embeddings and config.tie_output
    assert (config.pad_id, config.eos_id, config.unk_id, config.decoder_start_id) == (1, 2, 3, 2)
    assert ours.output_projection is None and ours.final_logits_bias is None
    assert ours.embed_scale == math.sqrt(config.d_model)


@pytest.mark.parametrize("dim", [16, 17])
def test_fairseq_table_equals_transformers(dim):
    expected = M2M100SinusoidalPositionalEmbedding.get_embedding(40, dim, padding_idx=PAD)
    actual = fairseq_positions(40, dim, PAD)
    assert torch.equal(actual, expected)  # the same float32 arithmetic: bit for bit
    assert not actual[PAD].any() and actual[PAD + 1].any()


def test_source_positions_count_only_non_pad_tokens(model_pair):
    _, ours = model_pair
    src_ids = torch.tensor([[60, 7, 8, 2, PAD, PAD], [61, PAD, 9, 2, PAD, PAD]])
    expected = torch.tensor([[2, 3, 4, 5, 1, 1], [2, 1, 3, 4, 1, 1]])  # pad -> row 1 (zero)
    assert torch.equal(ours.source_positions(src_ids), expected)


def test_encoder_output_matches_transformers_on_padded_batch(model_pair):
    hf_model, ours = model_pair
    src_ids, src_mask = fairseq_source([9, 5, 7, 3])
    with torch.no_grad():
        expected = hf_model.get_encoder()(input_ids=src_ids, attention_mask=src_mask)
        memory, _, _ = ours.encode(src_ids, src_mask)
    keep = src_mask.bool()  # padded slots' outputs are never attended to
    torch.testing.assert_close(
        memory[keep], expected.last_hidden_state[keep], atol=TOLERANCE, rtol=TOLERANCE
    )


def test_logits_match_transformers_full_and_step_by_step(model_pair):
    hf_model, ours = model_pair
    src_ids, src_mask = fairseq_source([9, 5, 7])
    generator = torch.Generator().manual_seed(2)
    tgt_ids = torch.randint(4, VOCAB, (3, 6), generator=generator)
    tgt_ids[:, 0] = ours.config.decoder_start_id
    tgt_ids[:, 1] = FIRST_CODE + torch.arange(3)  # the forced target-language codes
    with torch.no_grad():
        expected = hf_model(
            input_ids=src_ids, attention_mask=src_mask, decoder_input_ids=tgt_ids
        ).logits  # (B, T, V)
        full = ours(src_ids, src_mask, tgt_ids)
        # One token at a time through the KV cache, as the exported decoder runs: the
        # positions input is the number of earlier target tokens.
        _, cross_keys, cross_values = ours.encode(src_ids, src_mask)
        past_keys, past_values = ours.empty_cache(3)
        steps = []
        for step in range(tgt_ids.shape[1]):
            logits, past_keys, past_values = ours.decode_step(
                tgt_ids[:, step : step + 1],
                torch.full((3, 1), step),
                past_keys,
                past_values,
                cross_keys,
                cross_values,
                src_mask,
            )
            steps.append(logits)
    assert full.shape == expected.shape == (3, 6, VOCAB)
    torch.testing.assert_close(full, expected, atol=TOLERANCE, rtol=TOLERANCE)
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=TOLERANCE, rtol=TOLERANCE)


def hf_greedy(hf_model, src_ids, src_mask, forced: int, max_new_tokens: int) -> list[list[int]]:
    output = hf_model.generate(
        input_ids=src_ids,
        attention_mask=src_mask,
        num_beams=1,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        forced_bos_token_id=forced,
        bad_words_ids=[[PAD]],
    )
    hypotheses = []
    for row in output.tolist():
        tokens = row[1:]  # drop the decoder start token; keep the forced language code
        if EOS in tokens:
            tokens = tokens[: tokens.index(EOS)]
        hypotheses.append([t for t in tokens if t != PAD])
    return hypotheses


@pytest.mark.parametrize("target_code", [0, 2])
def test_greedy_with_forced_language_code_matches_generate(model_pair, target_code):
    hf_model, ours = model_pair
    forced = FIRST_CODE + target_code
    src_ids, src_mask = fairseq_source([12, 4, 8, 10, 6, 9, 7, 11], seed=3)
    max_new_tokens = 12
    expected = hf_greedy(hf_model, src_ids, src_mask, forced, max_new_tokens)
    actual = greedy_search(
        ours,
        src_ids,
        src_mask,
        max_new_tokens=max_new_tokens,
        forced_first_ids=torch.full((src_ids.shape[0],), forced),
    )
    assert actual == expected
    assert all(tokens[0] == forced for tokens in expected)
    # The comparison means something only if outputs differ by input and some stop on eos.
    assert len({tuple(tokens) for tokens in expected}) > 1
    assert any(len(tokens) < max_new_tokens for tokens in expected)


def test_save_and_reload_keeps_fairseq_positions(model_pair, tmp_path):
    _, ours = model_pair
    save_pretrained(ours, tmp_path)
    reloaded = load_pretrained(tmp_path)
    assert reloaded.config.positions == "fairseq"
    src_ids, src_mask = fairseq_source([6, 4])
    tgt_ids = torch.full((2, 3), ours.config.decoder_start_id)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(src_ids, src_mask, tgt_ids), ours(src_ids, src_mask, tgt_ids)
        )
