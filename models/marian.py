"""Import a local Hugging Face MarianMT (OPUS-MT) directory: no network, a renaming of weights.

``python -m models.marian --marian DIR --output DIR`` writes our format (see models/checkpoint.py),
which ``python -m export`` then turns into ONNX.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from models.config import Activation, TransformerConfig
from models.transformer import Transformer

_ACTIVATIONS: dict[str, Activation] = {
    "swish": "swish",
    "silu": "swish",
    "gelu": "gelu",
    "relu": "relu",
}

# Hugging Face parameter name (after the "model." prefix) -> ours, as regex substitutions.
_RENAMES = [
    (r"^(encoder|decoder)\.layers\.", r"\1_layers."),
    (r"\.self_attn_layer_norm\.", ".self_attn_sublayer.layer_norm."),
    (r"\.encoder_attn_layer_norm\.", ".encoder_attn_sublayer.layer_norm."),
    (r"\.final_layer_norm\.", ".feed_forward_sublayer.layer_norm."),
    (r"\.(fc1|fc2)\.", r".feed_forward.\1."),
]


def marian_config(
    hf_config: dict, hf_state: dict[str, torch.Tensor], vocab: dict[str, int] | None = None
) -> TransformerConfig:
    """Our config for a Marian checkpoint. Which tables are shared is read off the weights
    themselves: transformers' flags have changed meaning across versions, the tensors have not."""
    activation = hf_config.get("activation_function", "swish")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unsupported Marian activation {activation!r}")
    src_table, tgt_table = _embedding_tables(hf_state)
    output_table = hf_state.get("lm_head.weight")
    return TransformerConfig(
        src_vocab_size=src_table.shape[0],
        tgt_vocab_size=tgt_table.shape[0],
        share_embeddings=src_table.shape == tgt_table.shape and torch.equal(src_table, tgt_table),
        tie_output=output_table is None or torch.equal(output_table, tgt_table),
        final_logits_bias=True,
        d_model=hf_config["d_model"],
        encoder_layers=hf_config["encoder_layers"],
        decoder_layers=hf_config["decoder_layers"],
        encoder_heads=hf_config["encoder_attention_heads"],
        decoder_heads=hf_config["decoder_attention_heads"],
        encoder_ffn_dim=hf_config["encoder_ffn_dim"],
        decoder_ffn_dim=hf_config["decoder_ffn_dim"],
        max_positions=hf_config.get("max_position_embeddings", 512),
        normalize_before=hf_config.get("normalize_before", False),
        activation=_ACTIVATIONS[activation],
        scale_embedding=hf_config.get("scale_embedding", True),
        dropout=hf_config.get("dropout", 0.1),
        attention_dropout=hf_config.get("attention_dropout", 0.0),
        activation_dropout=hf_config.get("activation_dropout", 0.0),
        pad_id=hf_config["pad_token_id"],
        eos_id=hf_config["eos_token_id"],
        unk_id=(vocab or {}).get("<unk>", 1),
        decoder_start_id=hf_config.get("decoder_start_token_id", hf_config["pad_token_id"]),
    )


def _embedding_tables(hf_state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    shared = hf_state.get("model.shared.weight")
    src_table = hf_state.get("model.encoder.embed_tokens.weight", shared)
    tgt_table = hf_state.get("model.decoder.embed_tokens.weight", shared)
    if src_table is None or tgt_table is None:
        raise ValueError("Marian checkpoint has no token embeddings")
    return src_table, tgt_table


def read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """A Hugging Face directory's weights (safetensors, else the pickled state dict)."""
    if (model_dir / "model.safetensors").exists():
        return load_file(str(model_dir / "model.safetensors"))
    if (model_dir / "pytorch_model.bin").exists():
        return torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{model_dir} has neither model.safetensors nor pytorch_model.bin")


def imported_model(
    config: TransformerConfig, state: dict[str, torch.Tensor], kind: str
) -> Transformer:
    """Our model holding a converted checkpoint: every parameter filled, nothing left over."""
    model = Transformer(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{kind} import mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


def convert_state_dict(
    hf_state: dict[str, torch.Tensor], config: TransformerConfig
) -> dict[str, torch.Tensor]:
    src_table, tgt_table = _embedding_tables(hf_state)
    ours: dict[str, torch.Tensor] = {"src_embed.weight": src_table, "tgt_embed.weight": tgt_table}
    if not config.tie_output:
        ours["output_projection.weight"] = hf_state["lm_head.weight"]
    for name, tensor in hf_state.items():
        if name == "final_logits_bias":
            ours["final_logits_bias"] = tensor
        elif name.startswith(("model.encoder.layers.", "model.decoder.layers.")):
            short = name.removeprefix("model.")
            for pattern, replacement in _RENAMES:
                short = re.sub(pattern, replacement, short)
            ours[short] = tensor
        # else: embeddings (taken above), lm_head, sinusoidal positions (recomputed, not learned)
    return ours


def load_marian(marian_dir: str | Path) -> Transformer:
    marian_dir = Path(marian_dir)
    hf_config = json.loads((marian_dir / "config.json").read_text())
    vocab_path = marian_dir / "vocab.json"
    vocab = json.loads(vocab_path.read_text()) if vocab_path.exists() else None
    hf_state = read_hf_weights(marian_dir)
    config = marian_config(hf_config, hf_state, vocab)
    return imported_model(config, convert_state_dict(hf_state, config), "Marian")


def main() -> None:
    from models.save_format import save_pretrained

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--marian", required=True, help="local Hugging Face MarianMT directory")
    parser.add_argument("--output", required=True, help="directory to write in our format")
    args = parser.parse_args()
    model = load_marian(args.marian)
    save_pretrained(model, args.output, tokenizer_dir=args.marian)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
