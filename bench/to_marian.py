"""Write a Hugging Face MarianMTModel directory from our checkpoint, for the peer benchmark.

CTranslate2's converter, Optimum's exporter and ``transformers.generate`` all read the Marian
layout, not ours (models/checkpoint.py). This is the inverse of ``models.marian``: a renaming of
weights plus a MarianConfig, then a logits check against our model on random input.

    python bench/to_marian.py --model models/default --output bench/work/default/marian

Marian has no pre-norm stacks, no other layer-norm epsilon than 1e-5 and no learned positions,
so checkpoints using those switches are refused rather than converted wrongly. CTranslate2's
converter loads the tokenizer too: our Marian-layout tokenizer files are copied when present,
otherwise placeholder ones (``write_placeholder_tokenizer``) are written, which is enough for
benchmarks that feed token ids.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from models.checkpoint import copy_tokenizer_files, load_pretrained  # noqa: E402
from models.transformer import Transformer  # noqa: E402

MARIAN_LAYER_NORM_EPS = 1e-5  # hard-coded in transformers' Marian layers

# ours -> Hugging Face (after "model."), the inverse of models.marian._RENAMES
_RENAMES = [
    (r"^(encoder|decoder)_layers\.", r"\1.layers."),
    (r"\.self_attn_sublayer\.layer_norm\.", ".self_attn_layer_norm."),
    (r"\.encoder_attn_sublayer\.layer_norm\.", ".encoder_attn_layer_norm."),
    (r"\.feed_forward_sublayer\.layer_norm\.", ".final_layer_norm."),
    (r"\.feed_forward\.(fc1|fc2)\.", r".\1."),
]
_ACTIVATIONS = {"swish": "swish", "gelu": "gelu", "relu": "relu"}


def check_convertible(model: Transformer) -> None:
    config = model.config
    problems = []
    if config.normalize_before:
        problems.append("pre-norm (normalize_before=True); Marian is post-norm")
    if abs(config.layer_norm_eps - MARIAN_LAYER_NORM_EPS) > 1e-12:
        problems.append(f"layer_norm_eps={config.layer_norm_eps}; Marian uses 1e-5")
    if config.activation not in _ACTIVATIONS:
        problems.append(f"activation {config.activation!r}")
    if problems:
        raise ValueError("cannot express this checkpoint as Marian: " + "; ".join(problems))


def marian_config_dict(model: Transformer) -> dict:
    """Keyword arguments of ``transformers.MarianConfig`` for our model."""
    config = model.config
    return dict(
        vocab_size=config.src_vocab_size,
        decoder_vocab_size=config.tgt_vocab_size,
        share_encoder_decoder_embeddings=config.share_embeddings,
        tie_word_embeddings=config.tie_output,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_heads,
        decoder_attention_heads=config.decoder_heads,
        encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim,
        max_position_embeddings=config.max_positions,
        activation_function=_ACTIVATIONS[config.activation],
        scale_embedding=config.scale_embedding,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        pad_token_id=config.pad_id,
        eos_token_id=config.eos_id,
        decoder_start_token_id=config.decoder_start_id,
        # Our engine never forces eos at the length limit; neither should the peers.
        forced_eos_token_id=None,
    )


def marian_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our parameters under Hugging Face Marian names. Every table is written explicitly, so
    loaders of either transformers generation (whose tying flags differ) see the same values."""
    config = model.config
    state = model.state_dict()
    src_table, tgt_table = state["src_embed.weight"], state["tgt_embed.weight"]
    output_table = tgt_table if config.tie_output else state["output_projection.weight"]
    hf: dict[str, torch.Tensor] = {
        "model.encoder.embed_tokens.weight": src_table,
        "model.decoder.embed_tokens.weight": tgt_table,
        "lm_head.weight": output_table,
        "final_logits_bias": state.get("final_logits_bias", torch.zeros(1, config.tgt_vocab_size)),
    }
    if config.share_embeddings:
        hf["model.shared.weight"] = src_table
    for name, tensor in state.items():
        if name.startswith(("encoder_layers.", "decoder_layers.")):
            renamed = name
            for pattern, replacement in _RENAMES:
                renamed = re.sub(pattern, replacement, renamed)
            hf["model." + renamed] = tensor
    return hf


def to_marian(model: Transformer) -> torch.nn.Module:
    """A ``transformers.MarianMTModel`` holding our weights, in eval mode."""
    from transformers import MarianConfig, MarianMTModel

    check_convertible(model)
    hf_model = MarianMTModel(MarianConfig(**marian_config_dict(model))).eval()
    missing, unexpected = hf_model.load_state_dict(marian_state_dict(model), strict=False)
    # Sinusoidal position tables are computed, not stored; everything else must match.
    missing = [name for name in missing if "embed_positions" not in name]
    if missing or unexpected:
        raise ValueError(f"Marian export mismatch: missing {missing}, unexpected {unexpected}")
    return hf_model


def write_placeholder_tokenizer(output_dir: str | Path, vocab_size: int, pad_id: int) -> None:
    """Tokenizer files ``MarianTokenizer`` (and so CTranslate2's converter) can load: a tiny
    SentencePiece model and a ``vocab.json`` of ``vocab_size`` made-up pieces with Marian's ids
    (``</s>`` 0, ``<unk>`` 1, ``<pad>`` last). Only for benchmarks that feed token ids."""
    import sentencepiece as spm

    if pad_id != vocab_size - 1:
        raise ValueError("Marian layout needs <pad> at the last id")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_bytes = io.BytesIO()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    sentences = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 4
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model_bytes,
        model_type="word",
        vocab_size=len(words) + 3,
        eos_id=0,
        unk_id=1,
        bos_id=-1,
        pad_id=len(words) + 2,
        minloglevel=2,
    )
    for name in ("source.spm", "target.spm"):
        (output_dir / name).write_bytes(model_bytes.getvalue())
    vocab = {"</s>": 0, "<unk>": 1}
    vocab.update({f"▁tok{index}": index for index in range(2, vocab_size - 1)})
    vocab["<pad>"] = vocab_size - 1
    (output_dir / "vocab.json").write_text(json.dumps(vocab) + "\n")
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": "en",
        "target_lang": "de",
        "separate_vocabs": False,
        "model_max_length": 512,
        **special,
    }
    (output_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (output_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2))


@torch.no_grad()
def max_logit_difference(model: Transformer, hf_model: torch.nn.Module, seed: int = 0) -> float:
    """Teacher-forced logits of ours vs the Marian model on a random padded batch."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    low, high = 2, min(config.src_vocab_size, config.tgt_vocab_size) - 1  # no eos/unk/pad
    src_ids = torch.randint(low, high, (3, 9), generator=generator)
    src_ids[:, -1] = config.eos_id
    src_mask = torch.ones_like(src_ids)
    src_ids[1, 6:], src_mask[1, 6:] = config.pad_id, 0  # one padded row
    tgt_ids = torch.randint(low, high, (3, 7), generator=generator)
    tgt_ids[:, 0] = config.decoder_start_id
    ours = model(src_ids, src_mask, tgt_ids)
    theirs = hf_model(input_ids=src_ids, attention_mask=src_mask, decoder_input_ids=tgt_ids).logits
    return float((ours - theirs).abs().max())


def convert(model_dir: str | Path, output_dir: str | Path, tolerance: float = 1e-3) -> float:
    """Write the Marian dir for our checkpoint ``model_dir``; returns the max logit difference."""
    from transformers import MarianMTModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = load_pretrained(model_dir)
    output_dir = Path(output_dir)
    to_marian(model).save_pretrained(output_dir)
    if not copy_tokenizer_files(model_dir, output_dir):
        write_placeholder_tokenizer(output_dir, model.config.tgt_vocab_size, model.config.pad_id)
    # Check what is on disk, as the peers will load it.
    reloaded = MarianMTModel.from_pretrained(output_dir).eval()
    difference = max_logit_difference(model, reloaded)
    if not difference <= tolerance:
        raise ValueError(f"Marian logits differ from ours by {difference:.3g} (> {tolerance})")
    return difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="our checkpoint directory")
    parser.add_argument("--output", required=True, help="Marian directory to write")
    args = parser.parse_args()
    difference = convert(args.model, args.output)
    print(f"wrote {args.output}; max |logit difference| vs ours = {difference:.2e}")


if __name__ == "__main__":
    main()
