"""Import a local Hugging Face M2M-100 / NLLB-200 directory (``M2M100ForConditionalGeneration``,
``model_type: m2m_100``): no network, a renaming of weights, as models/marian.py does for Marian.

What differs from Marian is configuration, not code (models/config.py): pre-norm layers with a
final layer norm on each stack, ReLU, one table shared by encoder, decoder and output, scaled
by sqrt(d), no ``final_logits_bias``, and fairseq's sinusoidal positions. Ids use the fairseq
offsets: ``<s>=0, <pad>=1, </s>=2, <unk>=3``; decoding starts from ``</s>``.

``python -m models.m2m100 --m2m100 DIR --output DIR`` writes our format (models/checkpoint.py).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from models.config import TransformerConfig
from models.marian import _RENAMES as _LAYER_RENAMES
from models.marian import imported_model, read_hf_weights
from models.transformer import Transformer

MODEL_TYPE = "m2m_100"
FAIRSEQ_UNK_ID = 3  # the fairseq dictionary's <unk>, after <s>, <pad>, </s>

# Hugging Face parameter name (after the "model." prefix) -> ours: the layers are named as in
# Marian; the stacks' final layer norms are M2M-100's own.
_RENAMES = [
    (r"^encoder\.layer_norm\.", "encoder_final_norm."),
    (r"^decoder\.layer_norm\.", "decoder_final_norm."),
    *_LAYER_RENAMES,
]


def _embedding_table(hf_state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The one token table. Checkpoints save it as ``model.shared.weight``, some also under
    the stacks' ``embed_tokens``; a table that differs between them is not M2M-100's."""
    tables = [
        hf_state[name]
        for name in (
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
        )
        if name in hf_state
    ]
    if not tables:
        raise ValueError("M2M-100 checkpoint has no token embeddings")
    if any(not torch.equal(table, tables[0]) for table in tables[1:]):
        raise ValueError("M2M-100 checkpoint has different encoder and decoder embeddings")
    return tables[0]


def m2m100_config(hf_config: dict, hf_state: dict[str, torch.Tensor]) -> TransformerConfig:
    """Our config for an M2M-100 / NLLB checkpoint. Whether the output projection is the token
    table is read off the weights, as for Marian: a saved ``lm_head`` equal to it is tied."""
    activation = hf_config.get("activation_function", "relu")
    if activation not in ("relu", "gelu"):
        raise ValueError(f"unsupported M2M-100 activation {activation!r}")
    table = _embedding_table(hf_state)
    output_table = hf_state.get("lm_head.weight")
    pad_id = hf_config.get("pad_token_id", 1)
    eos_id = hf_config.get("eos_token_id", 2)
    return TransformerConfig(
        src_vocab_size=table.shape[0],
        tgt_vocab_size=table.shape[0],
        share_embeddings=True,
        tie_output=output_table is None or torch.equal(output_table, table),
        final_logits_bias=False,
        d_model=hf_config["d_model"],
        encoder_layers=hf_config["encoder_layers"],
        decoder_layers=hf_config["decoder_layers"],
        encoder_heads=hf_config["encoder_attention_heads"],
        decoder_heads=hf_config["decoder_attention_heads"],
        encoder_ffn_dim=hf_config["encoder_ffn_dim"],
        decoder_ffn_dim=hf_config["decoder_ffn_dim"],
        max_positions=hf_config.get("max_position_embeddings", 1024),
        normalize_before=True,
        activation=activation,
        scale_embedding=hf_config.get("scale_embedding", True),
        positions="fairseq",
        dropout=hf_config.get("dropout", 0.1),
        attention_dropout=hf_config.get("attention_dropout", 0.0),
        activation_dropout=hf_config.get("activation_dropout", 0.0),
        pad_id=pad_id,
        eos_id=eos_id,
        unk_id=FAIRSEQ_UNK_ID,
        decoder_start_id=hf_config.get("decoder_start_token_id", eos_id),
    )


def convert_state_dict(
    hf_state: dict[str, torch.Tensor], config: TransformerConfig
) -> dict[str, torch.Tensor]:
    table = _embedding_table(hf_state)
    ours: dict[str, torch.Tensor] = {"src_embed.weight": table, "tgt_embed.weight": table}
    if not config.tie_output:
        ours["output_projection.weight"] = hf_state["lm_head.weight"]
    for name, tensor in hf_state.items():
        if name.startswith(("model.encoder.", "model.decoder.")) and ".embed_" not in name:
            short = name.removeprefix("model.")
            for pattern, replacement in _RENAMES:
                short = re.sub(pattern, replacement, short)
            ours[short] = tensor
        # else: the token table (taken above), lm_head, sinusoidal positions (recomputed)
    return ours


def load_m2m100(model_dir: str | Path) -> Transformer:
    model_dir = Path(model_dir)
    hf_config = json.loads((model_dir / "config.json").read_text())
    if hf_config.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"{model_dir} is not an M2M-100 checkpoint: {hf_config.get('model_type')!r}"
        )
    hf_state = read_hf_weights(model_dir)
    config = m2m100_config(hf_config, hf_state)
    return imported_model(config, convert_state_dict(hf_state, config), "M2M-100")


def main() -> None:
    from models.save_format import save_pretrained

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--m2m100", required=True, help="local M2M-100 / NLLB-200 directory")
    parser.add_argument("--output", required=True, help="directory to write in our format")
    args = parser.parse_args()
    save_pretrained(load_m2m100(args.m2m100), args.output, tokenizer_dir=args.m2m100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
