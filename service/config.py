"""Service configuration, read from environment variables prefixed with ``MT_``.

Every field here is documented in README.md (section "Configuration"); keep the two in step.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.runtime.cpus import cpu_budget


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MT_", env_file=None, extra="ignore")

    # --- model and runtime -------------------------------------------------------------
    model_dir: Path = Field(
        Path("build/onnx/default"),
        description="Directory written by `python -m export`: encoder.onnx, decoder.onnx, "
        "config.json and the tokenizer files. Served alone when neither model_dirs nor "
        "models_dir is set.",
    )
    model_dirs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated export directories, one model each (`make serve` sets "
        "it to every shipped model). Each export's config.json declares source_lang and "
        "target_lang; two models for one pair are a start-up error.",
    )
    models_dir: Path | None = Field(
        None,
        description="A directory of exports: every sub-directory with a config.json is a "
        "model (added to model_dirs).",
    )
    model_name: str = Field(
        "",
        description="Name reported by the API for a model served alone; defaults to the "
        "export's model_name, else the directory name.",
    )
    provider: Literal["auto", "cuda", "cpu"] = Field(
        "auto",
        description="ONNX Runtime execution provider. `auto` uses CUDA when it actually loads, "
        "else CPU; `cuda` fails at start-up when CUDA cannot be used.",
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="ONNX Runtime intra-op threads per model. 0: one fewer than the CPUs this "
        "process may use (at least 1), so that the HTTP event loop keeps a core; the CPUs are "
        "the affinity mask capped by the container's CPU quota (cgroup v2 cpu.max or v1 "
        "cpu.cfs_quota_us), logged at start-up and exported as mt_cpus.",
    )
    kv_pool_mb: int = Field(
        1024,
        ge=0,
        description="Host memory (MiB) each CPU engine keeps, once its caches are done with it, "
        "for the next caches instead of returning it to the system, where first touches of "
        "fresh memory make a grown cache's copy much slower. 0: no reuse.",
    )
    vocab_screen: bool = Field(
        True,
        description="Use the exact int8 screen of greedy steps where an export has one (fp32 "
        "exports of 16,384 ids or more; CPU only): same outputs, faster greedy steps "
        "(docs/engine.md). false: always the full fp32 projection.",
    )

    # --- many models -------------------------------------------------------------------
    lazy_load: bool = Field(
        False,
        description="Load a model at its first request instead of at start-up (for "
        "deployments with many pairs). /ready then only waits for the language detector.",
    )
    max_loaded_models: int = Field(
        0,
        ge=0,
        description="Most models loaded at once; loading one more unloads the least recently "
        "used idle one (its in-flight work finishes first). 0: no bound. Models beyond the "
        "bound load lazily even when lazy_load is off.",
    )
    cold_start: Literal["wait", "reject"] = Field(
        "wait",
        description="A request for a model that is not loaded: `wait` for the load; `reject` "
        "with 503 + Retry-After while the load runs in the background.",
    )
    pivot_lang: str = Field(
        "en",
        description="With no direct model for X→Y, translate X→pivot→Y when both models exist "
        "(sentence by sentence; a direct model always wins). Empty: no pivoting.",
    )
    model_fairness: Literal["round_robin", "off"] = Field(
        "round_robin",
        description="With several models on one device, their engine threads take turns step "
        "by step (`round_robin`), so a flood on one pair cannot starve another; `off` lets "
        "them run at once (each step competes for the cores).",
    )
    language_detection: bool = Field(
        True,
        description="Detect the source language for `source: auto` (py3langid, restricted to "
        "the served source languages) and serve POST /detect. Off: `auto` means the only "
        "served source language, and is refused when there are several.",
    )

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
    max_inflight_requests: int = Field(
        128,
        ge=1,
        description="Most translation requests in progress at once. Beyond it a request is "
        "refused with 429 from its headers alone, before its body is read: under overload the "
        "refusals stay fast and the admitted requests' wait stays bounded.",
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
        description="`static` batching: longest time the oldest queued sentence waits for a "
        "full batch while the engine is idle (Triton's max_queue_delay); also `continuous` "
        "batching's idle wait on one CPU unless admission_idle_wait_ms is set.",
    )

    admission_idle_wait_ms: float | None = Field(
        None,
        ge=0,
        description="`continuous` batching: while the engine is idle, the oldest queued "
        "sentence waits up to this long for others to share its encoder call and first steps "
        "(as `static` batching waits static_max_wait_ms), where submissions come at least "
        "once in such a wait. Default: static_max_wait_ms where the encoder runs in line (one "
        "CPU), where a newcomer arriving just after an admission rarely joins it; 0 with "
        "encoder_overlap, where it joins from the encoder thread.",
    )
    admission_max_stall_steps: float = Field(
        2.0,
        gt=0,
        description="`continuous` batching without a spare core (the encoder runs in line): "
        "one admission's encoder call and merge stall the running rows for at most this many "
        "of their predicted steps; a bigger admission is cut into chunks between steps.",
    )

    background_max_rows: int = Field(
        4,
        ge=1,
        description="Rows of document-job sentences in the running batch at most. They join "
        "only when no interactive sentence waits, so a long document uses the engine's spare "
        "steps without slowing interactive requests much.",
    )

    background_max_wait_ms: float = Field(
        1000.0,
        ge=0,
        description="Document-job sentences join a batch with interactive rows running only "
        "once the oldest has waited this long (otherwise at a step boundary with none): "
        "documents use the spare steps, and still move under a steady interactive load.",
    )

    admission_cost_aware: bool = Field(
        True,
        description="`continuous` batching only: the engine's cost models (calibrated at "
        "start-up, refitted from live timings) decide how rows are grouped into decoder calls "
        "and who joins the running batch: newcomers join while it stays within the row count "
        "where this machine's tokens/s peak (within admission_cost_tolerance), and only when "
        "the delay summed over running rows and newcomers is lower joining now than waiting "
        "for the batch to drain. Off: every newcomer that fits joins at once.",
    )
    admission_cost_tolerance: float = Field(
        0.05,
        ge=0,
        le=1,
        description="See admission_cost_aware: the knee is the most rows whose predicted "
        "tokens/s are within this fraction of the best row count's.",
    )
    admission_max_tokens: int = Field(
        1024,
        ge=1,
        description="Most source tokens encoded for newcomers in one step (an empty batch "
        "always takes the head of the queue): bounds how long running rows wait for an "
        "admission's encoder calls.",
    )
    encoder_overlap: bool = Field(
        True,
        description="Continuous batching: newcomers are encoded on a second thread while the "
        "running rows take their decoder steps, and join the batch once encoded, so running "
        "rows do not wait for admissions' encoder calls. Only where a core is spare: with "
        "one CPU (affinity and cgroup quota) the encoder runs in line whatever this says.",
    )
    encoder_idle_priority: bool = Field(
        True,
        description="With encoder_overlap: the encoder thread runs at the OS's idle priority "
        "(Linux SCHED_IDLE), so that on busy cores the running rows' decoder steps and the HTTP "
        "event loop go first and newcomers' encoder calls take what is left.",
    )
    encoder_max_lag_ms: float = Field(
        150.0,
        ge=0,
        description="With encoder_overlap: an encoder call in flight for longer than this has "
        "the engine thread stop stepping and wait for it (freeing a core for it), so an "
        "idle-priority encoder thread cannot starve newcomers on busy cores. 0: never wait. "
        "A safety bound, not a tuning knob: every wait stalls the running rows.",
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

    # --- LibreTranslate extras, files, the web page ----------------------------------------
    alternatives_limit: int = Field(
        3,
        ge=0,
        description="Most `alternatives` a LibreTranslate /translate request may ask for (400 "
        "above it); alternatives come from the beam's n-best, so a request decodes with a beam "
        "of at least alternatives + 1 (capped by max_beam_size).",
    )
    files_translation: bool = Field(
        True, description="Serve POST /translate_file and /download_file (LibreTranslate's)."
    )
    files_dir: Path = Field(
        Path(tempfile.gettempdir()) / "mtserve-files",
        description="Where translated files wait for their download.",
    )
    files_ttl_s: float = Field(
        1800.0,
        gt=0,
        description="Translated files older than this are deleted (LibreTranslate: 30 min).",
    )
    data_dir: Path = Field(
        Path("data"),
        description="Where stored glossaries, translation memories (SQLite, mtserve.sqlite3) and "
        "document jobs (documents.sqlite3; uploads and results under documents/) live, kept "
        "across restarts; created on first use.",
    )
    deepl_character_limit: int = Field(
        0,
        ge=0,
        description="Characters each API key (each client address when keys are off) may "
        "translate through DeepL's /v2/translate per calendar month (UTC); DeepL's 456 "
        "above it, and /v2/usage reports it. 0: no limit.",
    )
    document_jobs: int = Field(
        1,
        ge=1,
        description="Document jobs (POST /v1/documents, DeepL's /v2/document) translated at "
        "once; each sends its sentences to the translator a few at a time, so interactive "
        "requests are not queued behind a document.",
    )
    document_ttl_s: float = Field(
        86400.0,
        gt=0,
        description="Finished document jobs (their upload and result) older than this are "
        "deleted (checked whenever a job is created).",
    )
    max_glossary_entries: int = Field(
        5000,
        ge=1,
        description="Most entries in one glossary, inline or stored (413 above it).",
    )
    frontend_timeout_ms: int = Field(
        500,
        ge=0,
        description="The web page waits this long after the last keystroke before it translates "
        "(LibreTranslate's frontendTimeout).",
    )

    # --- access control (all off by default) ---------------------------------------------
    api_keys: str = Field(
        "",
        description="Comma-separated API keys. Any key (here or in api_keys_file) turns keys "
        "on: translation requests then need `Authorization: Bearer KEY` (or LibreTranslate's "
        "`api_key` field); a missing key is 401, an unknown one 403.",
    )
    api_keys_file: Path | None = Field(
        None,
        description='JSON file of API keys with their own limits: {"KEY": '
        '{"requests_per_minute": 60, "chars_per_minute": 50000}, ...}; missing limits are the '
        "global ones below.",
    )
    rate_limit_requests_per_minute: int = Field(
        0,
        ge=0,
        description="Translation requests per minute per API key (or per client address "
        "without keys), moving window; beyond it 429 with Retry-After. 0: no limit.",
    )
    rate_limit_chars_per_minute: int = Field(
        0,
        ge=0,
        description="Characters to translate per minute per API key or client address, "
        "moving window; 0: no limit.",
    )
    metrics_token: str = Field(
        "", description="If set, `GET /metrics` needs `Authorization: Bearer TOKEN` (else 401)."
    )
    cors_origins: str = Field(
        "",
        description="Comma-separated origins allowed to call the API from a browser (CORS), "
        "or `*`; empty: no CORS headers.",
    )

    # --- process -----------------------------------------------------------------------
    host: str = "0.0.0.0"
    port: int = 8000
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="SIGTERM: time to finish in-flight work."
    )
    log_level: str = "info"
    access_log: bool = Field(
        True,
        description="uvicorn's access log, a line per request. false: none (request ids, "
        "errors and /metrics stay), which frees a share of the event loop under load.",
    )

    # --- processes (service/processes/supervisor.py) ----------------------------------------
    process_mode: Literal["multi", "single"] = Field(
        "multi",
        description="`python -m service`: `multi` runs the HTTP front-ends and each model's "
        "engine cores as separate processes behind one port, under a supervisor that "
        "restarts any that dies; `single` serves everything from one process.",
    )
    frontends: int = Field(
        0, ge=0, description="`multi`: HTTP front-end processes. 0: one per 4 CPUs (at least 1)."
    )
    engine_replicas: int = Field(
        0,
        ge=0,
        description="`multi`: engine-core processes per model, each with its own batch and "
        "intra_op_threads threads. 0: one per 4 CPUs left to the engines (at least 1; one on "
        "a GPU).",
    )

    def engine_threads(self) -> int:
        """ONNX Runtime intra-op threads for each engine (``intra_op_threads``, 0: auto)."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return cpu_budget().engine_threads

    @field_validator("model_dirs", mode="before")
    @classmethod
    def _split_model_dirs(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
