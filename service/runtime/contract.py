"""The ONNX interface between ``export/`` (which writes it) and the runtime (which reads it):
file names, input/output names, and the format version that says which of them an export has.

One module, imported by both sides, so that a renamed tensor cannot drift between writer and
reader. The runtime refuses an export whose ``format_version`` it does not know
(``check_format``) instead of guessing from the names it finds.

The graphs, per layer ``i`` of ``L`` decoder layers::

    encoder:  input_ids, attention_mask (B, S)
              -> encoder_hidden_states (B, S, D), cross_key_i, cross_value_i (B, H, S, Dh)
    decoder:  input_ids, positions, self_attention_mask (N, T), past_key_i, past_value_i
              (N, H, P, Dh), cross_key_i, cross_value_i (N, H, S, Dh), encoder_attention_mask
              (N, S), top_k, banned_ids, watch_ids [, vocab_screen]
              -> logits, new_key_i, new_value_i (N, H, T, Dh), top_log_probs, top_ids,
                 watch_log_probs
    decoder_device: the decoder's inputs and past_rows (N,), past_start (1,)
              -> logits, present_key_i, present_value_i (N, H, P - past_start + T, Dh),
                 top_log_probs, top_ids, watch_log_probs
              (the decoder for device caches, export/device_decoder.py: it gathers and trims
              its past and returns it grown; exports written before it have none, and the
              runtime then moves device caches with the helper graphs alone)
    kv_select / kv_merge / kv_append: helper graphs over the 2L cache tensors (device caches)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

# Format 3: the decoder returns the new keys/values only (caches with spare capacity, grown by
# kv_append) and ends in the search head. The runtime reads nothing else.
FORMAT_VERSION = 3
FORMAT_NAME = "mtserve-onnx"

CONFIG_FILE = "config.json"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
DEVICE_DECODER_FILE = "decoder_device.onnx"
KV_SELECT_FILE = "kv_select.onnx"
KV_MERGE_FILE = "kv_merge.onnx"
KV_APPEND_FILE = "kv_append.onnx"
KV_HELPER_FILES = (KV_SELECT_FILE, KV_MERGE_FILE, KV_APPEND_FILE)
# The helpers the device decoder leaves to run apart: it appends to its cache itself.
KV_MOVE_FILES = (KV_SELECT_FILE, KV_MERGE_FILE)
# The precisions an export comes in: fp32 from the exporter, int8 and fp16 made from it
# (export/variants.py); ``python -m service models pull --int8/--fp16`` installs one of them.
Variant = Literal["fp32", "int8", "fp16"]

ENCODER_INPUTS = ("input_ids", "attention_mask")
DECODER_STEP_INPUTS = ("input_ids", "positions", "self_attention_mask")
ENCODER_MASK_INPUT = "encoder_attention_mask"
# The search head's inputs and outputs (export/search_head.py): the only decoder outputs that
# cross to the host each step.
SEARCH_INPUTS = ("top_k", "banned_ids", "watch_ids")
SEARCH_OUTPUTS = ("top_log_probs", "top_ids", "watch_log_probs")
# A bool input of fp32 exports with a large vocabulary (export/vocab_screen.py): true runs the
# exact int8 screen of greedy steps.
SCREEN_INPUT = "vocab_screen"
# The device decoder's inputs: the cache rows each step row continues, the first slot kept.
PAST_ROWS_INPUT = "past_rows"
PAST_START_INPUT = "past_start"


def _per_layer(prefix: str, num_layers: int) -> list[str]:
    return [f"{prefix}_key_{i}" for i in range(num_layers)] + [
        f"{prefix}_value_{i}" for i in range(num_layers)
    ]


def past_names(num_layers: int) -> list[str]:
    """The self-attention cache inputs: every layer's keys, then every layer's values."""
    return _per_layer("past", num_layers)


def new_names(num_layers: int) -> list[str]:
    """The decoder's new self-attention keys/values for the fed positions."""
    return _per_layer("new", num_layers)


def present_names(num_layers: int) -> list[str]:
    """The device decoder's grown self-attention cache (past gathered, then the new keys)."""
    return _per_layer("present", num_layers)


def cross_names(num_layers: int) -> list[str]:
    """The cross-attention keys/values, computed once by the encoder graph."""
    return _per_layer("cross", num_layers)


def encoder_output_names(num_layers: int) -> list[str]:
    names = ["encoder_hidden_states"]
    for i in range(num_layers):
        names += [f"cross_key_{i}", f"cross_value_{i}"]
    return names


def decoder_input_names(num_layers: int) -> list[str]:
    """The decoder graph's model inputs, in the order torch.export flattens
    ``DecoderGraph.forward``'s arguments (the search head's inputs follow)."""
    return (
        list(DECODER_STEP_INPUTS)
        + past_names(num_layers)
        + cross_names(num_layers)
        + [ENCODER_MASK_INPUT]
    )


def decoder_output_names(num_layers: int) -> list[str]:
    return ["logits"] + new_names(num_layers)


class UnsupportedExport(RuntimeError):
    """The export directory was written in a format this runtime does not read."""


def check_format(config: Mapping[str, object], model_dir: object) -> None:
    """Refuse an export of another format version, with what to do about it."""
    version = config.get("format_version")
    if version == FORMAT_VERSION:
        return
    raise UnsupportedExport(
        f"{model_dir} is ONNX export format {version!r}; this runtime reads format "
        f"{FORMAT_VERSION}: re-run `python -m export` (`make onnx` for the shipped models)"
    )
