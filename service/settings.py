"""Service configuration, read from environment variables prefixed with ``MT_``.

Every field here is documented in README.md (section "Configuration"); keep the two in step.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MT_", env_file=None, extra="ignore")

    # --- model and runtime -------------------------------------------------------------
    model_dir: Path = Field(
        Path("build/onnx/default"),
        description="Directory written by `python -m export`: encoder.onnx, decoder.onnx, "
        "config.json and the tokenizer files.",
    )
    model_name: str = Field(
        "", description="Name reported by the API; defaults to the directory name."
    )
    provider: Literal["auto", "cuda", "cpu"] = Field(
        "auto",
        description="ONNX Runtime execution provider. `auto` uses CUDA when it actually loads, "
        "else CPU; `cuda` fails at start-up when CUDA cannot be used.",
    )
    intra_op_threads: int = Field(0, ge=0, description="ORT intra-op threads; 0 lets ORT choose.")

    # --- batching ----------------------------------------------------------------------
    max_batch_rows: int = Field(
        64, ge=1, description="Most rows (sentences x beams) in one decoder step."
    )
    max_batch_tokens: int = Field(
        8192,
        ge=16,
        description="Most source tokens (rows x padded length) admitted into the running batch.",
    )
    max_queue: int = Field(
        256, ge=1, description="Most queued sentences; beyond it requests get 429."
    )
    batching: Literal["continuous", "static"] = Field(
        "continuous",
        description="Admission policy. `continuous`: queued sentences join the running batch "
        "at every decoder step and finished rows leave at once. `static` (a baseline for "
        "comparison, like Triton's dynamic batcher): while the engine is idle, wait until "
        "max_batch_rows rows are queued or the oldest has waited static_max_wait_ms, admit "
        "that batch, and step it until all of its rows have finished before admitting again.",
    )
    static_max_wait_ms: float = Field(
        10.0,
        ge=0,
        description="`static` batching only: longest time the oldest queued sentence waits "
        "for a full batch while the engine is idle (Triton's max_queue_delay).",
    )

    admission_ratio: float = Field(
        0.25,
        ge=0,
        description="`continuous` batching only: while the batch is running, queued sentences "
        "join it once their rows are at least this fraction of the running rows (or would fill "
        "the batch, or the oldest has waited admission_max_wait_ms); one encoder call and one "
        "cache merge then serve several newcomers. 0 admits at every step.",
    )
    admission_max_wait_ms: float = Field(
        5.0,
        ge=0,
        description="`continuous` batching only: longest time the oldest queued sentence waits "
        "for admission into a running batch (see admission_ratio).",
    )

    admission_cost_aware: bool = Field(
        True,
        description="`continuous` batching only: newcomers join the running batch only while "
        "the engine's step-cost model (calibrated at start-up, refitted from live step "
        "timings) predicts that tokens/s do not fall by more than admission_cost_tolerance; "
        "past the machine's knee the others wait in the queue instead of slowing every row.",
    )
    admission_cost_tolerance: float = Field(
        0.02, ge=0, le=1, description="See admission_cost_aware (a fraction of tokens/s)."
    )
    admission_max_tokens: int = Field(
        1024,
        ge=1,
        description="Most source tokens encoded for newcomers in one step (an empty batch "
        "always takes the head of the queue): bounds how long running rows wait for an "
        "admission's encoder calls.",
    )

    # --- per-request limits ------------------------------------------------------------
    max_texts_per_request: int = Field(64, ge=1)
    max_chars_per_text: int = Field(5000, ge=1)
    max_input_tokens: int = Field(
        256, ge=8, description="Longest sentence in tokens after splitting."
    )
    max_new_tokens: int = Field(
        256, ge=1, description="Upper bound on generated tokens per sentence."
    )
    output_length_ratio: float = Field(
        2.0,
        gt=0,
        description="When a request gives no max_new_tokens, a sentence may generate "
        "ratio x its source tokens + output_length_slack tokens (at most max_new_tokens): "
        "a model that never emits eos must not hold a row for max_new_tokens steps.",
    )
    output_length_slack: int = Field(10, ge=1, description="See output_length_ratio.")
    length_penalty: float = Field(1.0, ge=0, description="Beam search length penalty (exponent).")
    max_beam_size: int = Field(8, ge=1)
    default_beam_size: int = Field(1, ge=1)
    max_body_bytes: int = Field(1_000_000, ge=1024)
    request_timeout_s: float = Field(60.0, gt=0)
    retry_after_s: int = Field(1, ge=1, description="Retry-After header value on 429/503.")
    disconnect_poll_s: float = Field(
        0.25, gt=0, description="How often a waiting request checks whether its client hung up."
    )
    translation_cache_size: int = Field(
        0,
        ge=0,
        description="Sentences kept in an LRU cache of finished translations (keyed by the "
        "sentence and the decoding options); 0 turns the cache off.",
    )

    # --- process -----------------------------------------------------------------------
    host: str = "0.0.0.0"
    port: int = 8000
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="SIGTERM: time to finish in-flight work."
    )
    log_level: str = "info"


@lru_cache
def get_settings() -> Settings:
    return Settings()
