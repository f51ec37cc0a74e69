"""A random M2M-100 model of NLLB-200's shape for bench/peers.py ``--arch nllb``, with the
tokenizer files every system needs to load it (no download: the SentencePiece model is a tiny
one trained here; the benchmark feeds ids, so only the id layout must be NLLB's).

Layout, as facebook/nllb-200-distilled-600M: fairseq's ``<s>=0, <pad>=1, </s>=2, <unk>=3``,
the pieces, then NLLB's 202 language codes, then ``<mask>``, then two unused rows (256,206 ids
for 256,000 pieces). ``tokenizer_config.json`` names the codes with their ids
(``added_tokens_decoder``, as transformers saves it), which our tokenizer
(service/text/tokenizer.py) and transformers' both read.

Outputs of a fixed length: M2M-100 has no logits bias to suppress eos with, so eos's row of
the tied table is a constant vector ``-1`` and the decoder's final layer norm gets bias ``+1``:
eos's logit is then ``-d_model`` below the rest's scale, while every layer norm removes the
constant from the residual stream wherever eos is an input (the sources' last id, the
decoder's start), so the model computes what it would otherwise.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from service.text.tokenizer import NLLB_LANGUAGE_CODES

SPARE_ROWS = 2  # NLLB's table has two rows past <mask>
NLLB_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_position_embeddings=256,
    ),
    # facebook/nllb-200-distilled-600M's config.json
    "600m": dict(
        vocab_size=256206,
        d_model=1024,
        encoder_layers=12,
        decoder_layers=12,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        max_position_embeddings=1024,
    ),
}


def piece_count(vocab_size: int) -> int:
    """SentencePiece pieces of a table of ``vocab_size`` rows in NLLB's layout."""
    return vocab_size - len(NLLB_LANGUAGE_CODES) - 2 - SPARE_ROWS


def language_ids(vocab_size: int) -> dict[str, int]:
    first = piece_count(vocab_size) + 1
    return {code: first + index for index, code in enumerate(NLLB_LANGUAGE_CODES)}


def write_tokenizer(output_dir: Path, vocab_size: int) -> None:
    """A tiny SentencePiece model (ids past it are never tokenized, only fed) and NLLB's
    tokenizer config with the codes at the ids the table has for them."""
    import sentencepiece as spm

    words = ["the", "a", "file", "save", "open", "close", "window", "help", "settings", "print"]
    sentences = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 4
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type="bpe",
        vocab_size=60,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    (output_dir / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    codes = language_ids(vocab_size)
    tokens = {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"}
    tokens.update({token_id: code for code, token_id in codes.items()})
    tokens[max(codes.values()) + 1] = "<mask>"
    decoder = {
        str(token_id): {"content": content, "lstrip": False, "normalized": False,
                        "rstrip": False, "single_word": False, "special": True}
        for token_id, content in tokens.items()
    }  # fmt: skip
    config = {
        "tokenizer_class": "NllbTokenizer",
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(NLLB_LANGUAGE_CODES),
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
        "src_lang": "eng_Latn",
        "tgt_lang": "deu_Latn",
        "model_max_length": 1024,
    }
    (output_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def build_random_nllb(output_dir: Path, size: str, seed: int, init_std: float) -> None:
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config = M2M100Config(
        **NLLB_SIZES[size],
        activation_function="relu",
        scale_embedding=True,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
        tie_word_embeddings=True,
        init_std=init_std,
        tokenizer_class="NllbTokenizer",
    )
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        table = model.get_input_embeddings().weight  # (V, D), tied with the output
        table[config.pad_token_id] = 0.0
        table[config.eos_token_id] = -1.0
        model.model.decoder.layer_norm.bias.add_(1.0)
    model.save_pretrained(output_dir)
    write_tokenizer(output_dir, config.vocab_size)
