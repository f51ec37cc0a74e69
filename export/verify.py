"""Verify an export against the PyTorch model it came from.

``python -m export.verify --model DIR --onnx DIR`` checks: ``onnx.checker`` on every graph; no
control flow in the decoder; the encoder's cross K/V and the decoder's logits and new keys/values
against PyTorch at past length 0, 1 and > 1 on a padded batch of 3 (fp32 tolerance 1e-4);
full greedy and beam-4 decodes through ``service.runtime.engine.Engine`` token-identical to
``models.search``. Exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from export.onnx_export import control_flow_ops
from export.vocab_screen import strip_vocab_screen
from models.checkpoint import load_pretrained
from models.search import beam_search, greedy_search
from models.transformer import Transformer
from service.runtime.contract import (
    DECODER_FILE,
    DEVICE_DECODER_FILE,
    ENCODER_FILE,
    KV_HELPER_FILES,
    SCREEN_INPUT,
)
from service.runtime.onnx_model import CUDA_OPTIONS, ProviderName


@dataclass
class Report:
    checks: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    decodes: dict[str, float] = field(default_factory=dict)  # fraction of identical outputs

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def padded_source(
    lengths: list[int], model: Transformer, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) source ids ending in eos, right-padded with pad, and the mask."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    special = {config.pad_id, config.eos_id, config.decoder_start_id}
    allowed = torch.tensor([t for t in range(config.src_vocab_size) if t not in special])
    src_ids = torch.full((len(lengths), max(lengths)), config.pad_id)
    src_mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        picks = torch.randint(0, len(allowed), (length - 1,), generator=generator)
        src_ids[row, : length - 1] = allowed[picks]
        src_ids[row, length - 1] = config.eos_id
        src_mask[row, :length] = 1
    return src_ids, src_mask


def sessions(
    onnx_dir: Path, provider: ProviderName = "cpu"
) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    """Encoder and decoder sessions on ``provider``; "cuda" refuses to fall back to the CPU
    (onnxruntime-gpu lists CUDA even where it cannot load it, then runs on the CPU)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    wanted = "CUDAExecutionProvider" if provider == "cuda" else "CPUExecutionProvider"
    providers = [(wanted, CUDA_OPTIONS if provider == "cuda" else {})]
    opened = tuple(
        ort.InferenceSession(str(onnx_dir / name), options, providers=providers)
        for name in (ENCODER_FILE, DECODER_FILE)
    )
    for session in opened:
        if session.get_providers()[0] != wanted:
            raise RuntimeError(f"{wanted} did not load: {session.get_providers()}")
    return opened[0], opened[1]


def _typed_feeds(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict:
    """Float feeds in the dtype the graph declares: an fp16 export takes its caches in fp16."""
    half = {value.name for value in session.get_inputs() if value.type == "tensor(float16)"}
    return {
        name: value.astype(np.float16) if name in half else value for name, value in feeds.items()
    }


def _as_float32(outputs: list) -> list[np.ndarray]:
    return [np.asarray(output, dtype=np.float32) for output in outputs]


@torch.no_grad()
def logits_errors(
    model: Transformer, onnx_dir: Path, past_lengths=(0, 1, 3), provider: ProviderName = "cpu"
) -> dict[str, float]:
    """Max |ORT - PyTorch| of cross K/V, logits and new keys/values; a padded batch of 3, with the first
    row joining late (invalid left cache slots), at each past length; T = 1 and T = 2 new tokens.
    An fp16 export is fed and read in fp16 and compared in fp32 with the fp32 PyTorch model."""
    config = model.config
    layers = config.decoder_layers
    encoder, decoder = sessions(onnx_dir, provider)
    src_ids, src_mask = padded_source([7, 3, 5], model)
    _, cross_keys, cross_values = model.encode(src_ids, src_mask)
    outputs = _as_float32(
        encoder.run(None, {"input_ids": src_ids.numpy(), "attention_mask": src_mask.numpy()})
    )
    names = [o.name for o in encoder.get_outputs()]
    errors = {"encoder_cross_kv": 0.0}
    for i in range(layers):
        for name, expected_kv in (
            (f"cross_key_{i}", cross_keys[i]),
            (f"cross_value_{i}", cross_values[i]),
        ):
            got_kv = outputs[names.index(name)]
            errors["encoder_cross_kv"] = max(
                errors["encoder_cross_kv"], float(np.abs(got_kv - expected_kv.numpy()).max())
            )

    generator = torch.Generator().manual_seed(2)
    batch = src_ids.shape[0]
    out_names = [output.name for output in decoder.get_outputs()]
    screened = any(value.name == SCREEN_INPUT for value in decoder.get_inputs())
    for past_len in past_lengths:
        for new_len in (1,):  # the exported step graph takes one new token per row
            shape = (batch, config.decoder_heads, past_len, config.decoder_head_dim)
            past_keys = tuple(torch.randn(shape, generator=generator) for _ in range(layers))
            past_values = tuple(torch.randn(shape, generator=generator) for _ in range(layers))
            input_ids = torch.randint(
                1, config.tgt_vocab_size - 1, (batch, new_len), generator=generator
            )
            positions = (
                torch.arange(past_len, past_len + new_len).expand(batch, new_len).contiguous()
            )
            self_mask = torch.ones(batch, past_len + new_len, dtype=torch.long)
            if past_len:
                self_mask[0, : past_len - (past_len > 1)] = 0  # row 0 joined late
                positions[0] -= past_len - (past_len > 1)
            expected = model.decode_new(
                input_ids,
                positions,
                past_keys,
                past_values,
                cross_keys,
                cross_values,
                src_mask,
                self_mask,
            )
            feeds = {
                "input_ids": input_ids.numpy(),
                "positions": positions.numpy(),
                "encoder_attention_mask": src_mask.numpy(),
                # the search head: top 5 with pad banned, a few ids watched
                "top_k": np.array([5], dtype=np.int64),
                "banned_ids": np.full((batch * new_len, 1), config.pad_id, dtype=np.int64),
                "watch_ids": np.tile(np.arange(3, dtype=np.int64), (batch * new_len, 1)),
            }
            if screened:  # top 5 is never screened; the input is required all the same
                feeds[SCREEN_INPUT] = np.array(False)
            for i in range(layers):
                feeds[f"cross_key_{i}"] = cross_keys[i].numpy()
                feeds[f"cross_value_{i}"] = cross_values[i].numpy()
            expected_log_probs = torch.log_softmax(expected[0], dim=-1).flatten(0, 1)
            expected_log_probs[:, config.pad_id] = float("-inf")  # the head ranks N*T rows
            expected_top = expected_log_probs.topk(5, dim=-1).values.numpy()
            # The cache as it is (C = P), and with 3 spare slots of junk after it, masked (the
            # host's caches with spare capacity): both must give PyTorch's answer on C = P.
            for spare in (0, 3):
                junk = (batch, config.decoder_heads, spare, config.decoder_head_dim)

                def with_spare(cache: torch.Tensor, junk=junk) -> np.ndarray:
                    return torch.cat(
                        [cache, 1e3 * torch.randn(junk, generator=generator)], 2
                    ).numpy()

                for i in range(layers):
                    feeds[f"past_key_{i}"] = with_spare(past_keys[i])
                    feeds[f"past_value_{i}"] = with_spare(past_values[i])
                mask = np.zeros((batch, past_len + spare + new_len), dtype=np.int64)
                mask[:, :past_len] = self_mask[:, :past_len].numpy()
                mask[:, past_len + spare :] = self_mask[:, past_len:].numpy()
                feeds["self_attention_mask"] = mask
                got = _as_float32(decoder.run(None, _typed_feeds(decoder, feeds)))
                tag = f"P{past_len}_T{new_len}" + (f"_spare{spare}" if spare else "")
                errors[f"logits_{tag}"] = float(
                    np.abs(got[out_names.index("logits")] - expected[0].numpy()).max()
                )
                errors[f"search_head_{tag}"] = float(
                    np.abs(got[out_names.index("top_log_probs")] - expected_top).max()
                )
                errors[f"new_kv_{tag}"] = max(
                    float(np.abs(got[out_names.index(f"new_{kind}_{i}")] - new[i].numpy()).max())
                    for i in range(layers)
                    for kind, new in (("key", expected[1]), ("value", expected[2]))
                )
    return errors


def decode_agreement(
    model: Transformer,
    onnx_dir: Path,
    lengths: list[int],
    beam_sizes=(1, 4),
    max_new_tokens: int = 16,
    provider: ProviderName = "cpu",
) -> dict[str, float]:
    """Fraction of sentences whose engine output equals models.search's (greedy, beam)."""
    from service.runtime.engine import Engine

    engine = Engine.from_dir(onnx_dir, provider=provider)
    never = (model.config.unk_id,)  # the engine never generates the unknown token
    src_ids, src_mask = padded_source(lengths, model, seed=3)
    sources = [row[: int(mask.sum())].tolist() for row, mask in zip(src_ids, src_mask, strict=True)]
    result = {}
    for beam in beam_sizes:
        if beam == 1:
            expected = greedy_search(
                model, src_ids, src_mask, max_new_tokens=max_new_tokens, suppress_ids=never
            )
        else:
            expected = beam_search(
                model,
                src_ids,
                src_mask,
                beam_size=beam,
                max_new_tokens=max_new_tokens,
                suppress_ids=never,
            )
        actual = engine.translate_ids(sources, beam_size=beam, max_new_tokens=max_new_tokens)
        same = sum(a == e for a, e in zip(actual, expected, strict=True))
        result[f"beam{beam}"] = same / len(sources)
    return result


def verify(model: Transformer, onnx_dir: str | Path, tolerance: float = 1e-4) -> Report:
    onnx_dir = Path(onnx_dir)
    report = Report()
    for name in (ENCODER_FILE, DECODER_FILE, DEVICE_DECODER_FILE, *KV_HELPER_FILES):
        onnx.checker.check_model(str(onnx_dir / name), full_check=True)
        report.checks[f"checker:{name}"] = True
    decoder = onnx.load(onnx_dir / DECODER_FILE)
    strip_vocab_screen(decoder)  # its If is the one control flow a decoder may have
    report.checks["decoder_has_no_control_flow"] = not control_flow_ops(decoder)
    report.errors = logits_errors(model, onnx_dir)
    report.checks["logits_within_tolerance"] = max(report.errors.values()) <= tolerance
    report.decodes = decode_agreement(model, onnx_dir, [12, 4, 8, 10, 6, 9, 7, 11])
    report.checks["decodes_token_identical"] = all(
        value == 1.0 for value in report.decodes.values()
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="PyTorch model dir (ours or Marian)")
    parser.add_argument("--onnx", required=True, help="fp32 export dir written by python -m export")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args(argv)
    report = verify(load_pretrained(args.model), args.onnx, args.tolerance)
    print(json.dumps({"ok": report.ok, **report.__dict__}, indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
