"""What the runtime knows of an export, and the host side of one decoder call.

``ModelInfo`` is read from an export's config.json (service/runtime/contract.py names the
file). A decoder call over N rows takes ``StepInputs`` (token ids, positions, masks, bans: host
int64) and returns a ``StepOutput``: the search head's top-k (export/search_head.py), never
the full logits. The KV backends (service/runtime/kv_cache.py) run the call; the groups
(service/runtime/groups.py) build the inputs and the searches read the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.runtime.types import DecodeRequest


@dataclass(frozen=True)
class ModelInfo:
    """What the runtime needs to know about an export (read from its config.json)."""

    model_name: str
    num_layers: int
    num_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    pad_id: int
    eos_id: int
    unk_id: int
    decoder_start_id: int
    variant: str
    kv_dtype: str

    @classmethod
    def from_config(cls, config: dict, default_name: str) -> ModelInfo:
        ids = config["special_ids"]
        return cls(
            model_name=config.get("model_name") or default_name,
            num_layers=config["num_layers"],
            num_heads=config["num_heads"],
            head_dim=config["head_dim"],
            vocab_size=config["vocab_size"],
            max_positions=config["max_positions"],
            pad_id=ids["pad_id"],
            eos_id=ids["eos_id"],
            unk_id=ids["unk_id"],
            decoder_start_id=ids["decoder_start_id"],
            variant=config.get("variant", "fp32"),
            kv_dtype=config.get("kv_dtype", "float32"),
        )

    def refusal(self, request: DecodeRequest) -> str | None:
        """Why this model cannot decode ``request``, or None."""
        if not request.src_ids:
            return "empty source"
        if len(request.src_ids) > self.max_positions:
            return (
                f"{len(request.src_ids)} source tokens, the model has "
                f"{self.max_positions} positions"
            )
        if request.max_new_tokens < 1:
            return "max_new_tokens must be >= 1"
        if not 1 <= request.beam_size <= self.vocab_size // 2:
            return f"beam_size must be between 1 and {self.vocab_size // 2}"
        if any(not 0 <= token < self.vocab_size for token in request.src_ids):
            return f"source token ids must be in [0, {self.vocab_size})"
        return None


@dataclass(frozen=True)
class StepInputs:
    """Host inputs of one decoder call over N rows (all int64)."""

    input_ids: np.ndarray  # (N, T)
    positions: np.ndarray  # (N, T)
    self_attention_mask: np.ndarray  # (N, P+T)
    encoder_attention_mask: np.ndarray  # (N, S)
    top_k: int
    banned_ids: np.ndarray  # (N, B): -inf before the log-softmax (pad-filled)
    watch_ids: np.ndarray  # (N, W): log-probs (before bans) wanted besides the top k

    @classmethod
    def lockstep(
        cls,
        tokens: np.ndarray,
        position: int,
        encoder_attention_mask: np.ndarray,
        top_k: int,
        pad_id: int,
        bans: int = 1,
    ) -> StepInputs:
        """Rows that all started together and are at ``position``: no late joiners, pad
        banned (``bans`` columns of it), nothing watched (calibration, variant checks)."""
        rows = len(tokens)
        return cls(
            input_ids=tokens,
            positions=np.full((rows, 1), position, dtype=np.int64),
            self_attention_mask=np.ones((rows, position + 1), dtype=np.int64),
            encoder_attention_mask=encoder_attention_mask,
            top_k=top_k,
            banned_ids=np.full((rows, bans), pad_id, dtype=np.int64),
            watch_ids=np.full((rows, 1), pad_id, dtype=np.int64),
        )

    def feeds(self) -> dict[str, np.ndarray]:
        as_int64 = lambda array: np.ascontiguousarray(array, dtype=np.int64)  # noqa: E731
        return {
            "input_ids": as_int64(self.input_ids),
            "positions": as_int64(self.positions),
            "self_attention_mask": as_int64(self.self_attention_mask),
            "encoder_attention_mask": as_int64(self.encoder_attention_mask),
            "top_k": np.array([self.top_k], dtype=np.int64),
            "banned_ids": as_int64(self.banned_ids),
            "watch_ids": as_int64(self.watch_ids),
        }


@dataclass(frozen=True)
class StepOutput:
    """What the host receives from one decoder call: the search head, ``rows x k`` numbers."""

    top_log_probs: np.ndarray  # (N, k) float32, bans applied, best first
    top_ids: np.ndarray  # (N, k) int64
    watch_log_probs: np.ndarray  # (N, W) float32, before the bans
    watch_ids: np.ndarray  # (N, W) int64: the ids watched (an input, kept beside its answer)

    def rows(self, start: int, end: int) -> StepOutput:
        return StepOutput(
            self.top_log_probs[start:end],
            self.top_ids[start:end],
            self.watch_log_probs[start:end],
            self.watch_ids[start:end],
        )
