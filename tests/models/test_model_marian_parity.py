"""Our transformer, imported from a Marian checkpoint, against Hugging Face transformers."""

from __future__ import annotations

import pytest
import torch

from models.checkpoint import load_pretrained, save_pretrained
from models.search import beam_search, greedy_search
from tests.conftest import build_random_marian

VARIANTS = {
    "untied_head": dict(tie_word_embeddings=False),
    "tied_shared": dict(tie_word_embeddings=True),
    "separate_vocabularies": dict(
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=80,
        pad_token_id=79,
        decoder_start_token_id=79,
        tie_word_embeddings=False,
    ),
    "relu_unscaled": dict(
        activation_function="relu", scale_embedding=False, tie_word_embeddings=False
    ),
}


def padded_batch(lengths: list[int], vocab: int, pad: int, eos: int, seed: int = 1):
    """Source ids (B, S) ending in eos, right-padded, and their mask."""
    generator = torch.Generator().manual_seed(seed)
    src_len = max(lengths)
    src_ids = torch.full((len(lengths), src_len), pad)
    src_mask = torch.zeros(len(lengths), src_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        src_ids[row, : length - 1] = torch.randint(2, vocab - 1, (length - 1,), generator=generator)
        src_ids[row, length - 1] = eos
        src_mask[row, :length] = 1
    return src_ids, src_mask


def hf_generate(
    hf_model, src_ids, src_mask, num_beams: int, max_new_tokens: int
) -> list[list[int]]:
    config = hf_model.config
    output = hf_model.generate(
        input_ids=src_ids,
        attention_mask=src_mask,
        num_beams=num_beams,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        length_penalty=1.0,
        early_stopping=False,
        forced_eos_token_id=None,
        bad_words_ids=[[config.pad_token_id]],
    )
    hypotheses = []
    for row in output.tolist():
        tokens = row[1:]  # drop the decoder start token
        if config.eos_token_id in tokens:
            tokens = tokens[: tokens.index(config.eos_token_id)]
        hypotheses.append([t for t in tokens if t != config.pad_token_id])
    return hypotheses


@pytest.fixture(scope="module", params=list(VARIANTS))
def model_pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf_model = build_random_marian(path, seed=len(request.param), **VARIANTS[request.param])
    return hf_model, load_pretrained(path)


def test_imported_logits_match_transformers_on_padded_batch(model_pair):
    hf_model, ours = model_pair
    config = ours.config
    src_ids, src_mask = padded_batch([9, 5, 7], config.src_vocab_size, config.pad_id, config.eos_id)
    tgt_ids = torch.randint(1, config.tgt_vocab_size - 1, (3, 6))
    tgt_ids[:, 0] = config.decoder_start_id
    with torch.no_grad():
        expected = hf_model(
            input_ids=src_ids, attention_mask=src_mask, decoder_input_ids=tgt_ids
        ).logits
        actual = ours(src_ids, src_mask, tgt_ids)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_search_matches_transformers_generate(model_pair, num_beams):
    hf_model, ours = model_pair
    config = ours.config
    src_ids, src_mask = padded_batch(
        [12, 4, 8, 10, 6, 9, 7, 11], config.src_vocab_size, config.pad_id, config.eos_id, seed=3
    )
    max_new_tokens = 12
    expected = hf_generate(hf_model, src_ids, src_mask, num_beams, max_new_tokens)
    if num_beams == 1:
        actual = greedy_search(ours, src_ids, src_mask, max_new_tokens=max_new_tokens)
    else:
        actual = beam_search(
            ours, src_ids, src_mask, beam_size=num_beams, max_new_tokens=max_new_tokens
        )
    assert actual == expected
    # The comparison means something only if outputs differ by input and some stop on eos.
    assert len({tuple(tokens) for tokens in expected}) > 1
    assert any(len(tokens) < max_new_tokens for tokens in expected)


def test_save_and_reload_preserves_outputs(model_pair, tmp_path):
    _, ours = model_pair
    save_pretrained(ours, tmp_path)
    reloaded = load_pretrained(tmp_path)
    config = ours.config
    src_ids, src_mask = padded_batch([6, 4], config.src_vocab_size, config.pad_id, config.eos_id)
    tgt_ids = torch.full((2, 3), config.decoder_start_id)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(src_ids, src_mask, tgt_ids), ours(src_ids, src_mask, tgt_ids)
        )
