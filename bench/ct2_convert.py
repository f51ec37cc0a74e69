"""Our checkpoint as a CTranslate2 model, through CTranslate2's own ``TransformerSpec``.

    .venv/bin/python bench/ct2_convert.py --model models/default --output build/ct2/default \\
        [--quantization int8]

The shipped models (models/transformer.py, config.json) map onto the spec as they are:
pre-norm layers with the stacks' final layer norms, ReLU, one tied table for the source and
target embeddings and the output projection, embeddings scaled by sqrt(d), ``final_logits_bias``
as the projection's bias, and the sinusoidal position table given explicitly (CTranslate2's
built-in one interleaves another formula). Q/K/V are stacked as CTranslate2 stores them (one
projection for self-attention; Q, then K and V stacked, for cross-attention). The vocabulary
is ``vocab.json``'s pieces in id order, so an id sequence maps to tokens one to one; callers
append ``</s>`` to the source (as our tokenizer does) and decoding starts from ``<pad>`` (the
config's ``decoder_start_id``).

Only pre-norm models with Marian positions are converted (both shipped models); anything else
is refused rather than converted into a model that differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def vocabulary(model_dir: Path, size: int) -> list[str]:
    """``vocab.json``'s pieces in id order (ids 0 .. size-1, each exactly once)."""
    pieces = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))
    by_id = {index: piece for piece, index in pieces.items()}
    missing = [index for index in range(size) if index not in by_id]
    if missing:
        raise ValueError(f"{model_dir}/vocab.json has no piece for ids {missing[:5]}")
    return [by_id[index] for index in range(size)]


def model_spec(model_dir: Path):  # -> ctranslate2.specs.TransformerSpec
    import ctranslate2.specs as specs
    from ctranslate2.specs import common_spec

    from models.checkpoint import load_pretrained
    from models.transformer import sinusoidal_positions

    model = load_pretrained(model_dir).eval()
    config = model.config
    if not config.normalize_before or config.positions != "marian":
        raise ValueError(f"{model_dir}: only pre-norm models with Marian positions convert")
    if not (config.share_embeddings and config.tie_output):
        raise ValueError(f"{model_dir}: only one tied embedding table converts")
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    spec = specs.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers),
        config.encoder_heads,
        pre_norm=True,
        activation=activation[config.activation],
    )
    if config.decoder_heads != config.encoder_heads:
        raise ValueError(f"{model_dir}: CTranslate2's spec has one head count")
    numpy = lambda tensor: tensor.detach().float().numpy()  # noqa: E731
    table = numpy(model.src_embed.weight)  # (V, D), tied everywhere
    positions = numpy(sinusoidal_positions(config.max_positions, config.d_model))
    scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0

    def linear(target, *modules) -> None:
        target.weight = numpy_cat([numpy(m.weight) for m in modules])
        target.bias = numpy_cat([numpy(m.bias) for m in modules])

    def norm(target, module) -> None:
        target.gamma, target.beta = numpy(module.weight), numpy(module.bias)

    def common(target, final_norm) -> None:
        target.scale_embeddings = scale
        target.position_encodings.encodings = positions
        embeddings = (
            target.embeddings[0] if isinstance(target.embeddings, list) else target.embeddings
        )
        embeddings.weight = table
        norm(target.layer_norm, final_norm)

    common(spec.encoder, model.encoder_final_norm)
    for target, layer in zip(spec.encoder.layer, model.encoder_layers, strict=True):
        attention = layer.self_attn
        linear(
            target.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj
        )
        linear(target.self_attention.linear[1], attention.out_proj)
        norm(target.self_attention.layer_norm, layer.self_attn_sublayer.layer_norm)
        linear(target.ffn.linear_0, layer.feed_forward.fc1)
        linear(target.ffn.linear_1, layer.feed_forward.fc2)
        norm(target.ffn.layer_norm, layer.feed_forward_sublayer.layer_norm)

    common(spec.decoder, model.decoder_final_norm)
    for target, layer in zip(spec.decoder.layer, model.decoder_layers, strict=True):
        attention = layer.self_attn
        linear(
            target.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj
        )
        linear(target.self_attention.linear[1], attention.out_proj)
        norm(target.self_attention.layer_norm, layer.self_attn_sublayer.layer_norm)
        cross = layer.encoder_attn
        linear(target.attention.linear[0], cross.q_proj)
        linear(target.attention.linear[1], cross.k_proj, cross.v_proj)
        linear(target.attention.linear[2], cross.out_proj)
        norm(target.attention.layer_norm, layer.encoder_attn_sublayer.layer_norm)
        linear(target.ffn.linear_0, layer.feed_forward.fc1)
        linear(target.ffn.linear_1, layer.feed_forward.fc2)
        norm(target.ffn.layer_norm, layer.feed_forward_sublayer.layer_norm)
    spec.decoder.projection.weight = table
    if model.final_logits_bias is not None:
        spec.decoder.projection.bias = numpy(model.final_logits_bias).reshape(-1)

    tokens = vocabulary(model_dir, config.tgt_vocab_size)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.bos_token = tokens[config.decoder_start_id]
    spec.config.eos_token = tokens[config.eos_id]
    spec.config.unk_token = tokens[config.unk_id]
    spec.config.decoder_start_token = tokens[config.decoder_start_id]
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    return spec


def decoding_options(beam: int, max_decoding_length: int) -> dict:
    """``Translator.translate_batch`` options every bench decodes with: the service's rules
    (never ``<unk>``, never ``<pad>``) and the whole batch in one call."""
    return {
        "beam_size": beam,
        "max_batch_size": 0,
        "max_decoding_length": max_decoding_length,
        "disable_unk": True,
        "suppress_sequences": [["<pad>"]],
    }


def numpy_cat(arrays: list):
    import numpy as np

    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)


def convert(model_dir: Path, output: Path, quantization: str | None = None) -> Path:
    """Write the CTranslate2 model of ``model_dir`` to ``output`` (weights in
    ``quantization``: None keeps float32, "int8" quantizes as ``ct2-*-converter`` does)."""
    spec = model_spec(Path(model_dir))
    spec.validate()
    spec.optimize(quantization=quantization)
    output.mkdir(parents=True, exist_ok=True)
    spec.save(str(output))
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--quantization", default=None, help="e.g. int8 (default: float32)")
    args = parser.parse_args(argv)
    print(convert(args.model, args.output, args.quantization))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
