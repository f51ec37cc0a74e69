"""The model settings: which exports are served, how each engine opens them, and how many
models share the process (``MT_EXPORTS`` ... ``MT_LANGUAGE_DETECTION``).

Where models come from, one setting each: ``exports`` (export directories served as they
are), ``models_dir`` (the installed models, where ``python -m service models pull`` writes)
and ``models`` (names pulled into it at start-up); ``served_model_name`` names a model served
alone.

The object itself is what the model registry (service/translation/registry.py) and each
engine (``EngineOptions``: service/runtime/engine.py) read; service/config.py reads it from
the environment as part of ``Settings``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from service.cpus import cpu_budget

DEFAULT_EXPORT = Path("build/onnx/default")  # served when no model is configured (`make export`)


class ModelSettings(BaseModel):
    """Models and runtime."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exports: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated export directories (written by `python -m export`: "
        "encoder.onnx, decoder.onnx, config.json and the tokenizer files), one model each "
        "(`make serve` sets it to every shipped model). Each export's config.json declares "
        "source_lang and target_lang; two models for one pair are a start-up error. Empty: "
        "build/onnx/default when models_dir holds no model either.",
    )
    models_dir: Path | None = Field(
        None,
        description="The installed models: every sub-directory with a config.json is a "
        "model, served beside the exports (one of them replaces an export of its pair). "
        "`python -m service models pull` installs here (unset: into MT_DATA_DIR/models); "
        "`make serve` sets it to that directory.",
    )
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated model names (`opus-mt-en-fr,nllb-200-distilled-600M`, as "
        "`python -m service models pull` takes them) that `python -m service` pulls at "
        "start-up when they are not installed, before any model loads (TGI's --model-id), "
        "into models_dir (unset: MT_DATA_DIR/models, then served from there). A failed pull "
        "is logged and the process exits with status 1. Pulling needs the export extras "
        "(torch; the `models` image). Empty: nothing is downloaded.",
    )
    reload_poll_s: float = Field(
        10.0,
        ge=0,
        description="How often the service checks the loaded installed models for a new "
        "revision (`python -m service models update`) and swaps it in: it loads beside the old "
        "one (twice the model's memory meanwhile), and no request fails for the swap. With "
        "engine-core processes (`multi`) the supervisor checks and starts engine cores of the "
        "new revision; each front-end hears of the move from the old engine cores within a "
        "ping and swaps at once (it checks this often again should that swap fail to load). "
        "0: never.",
    )
    load_only: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated languages (`en,de,fr`; LibreTranslate's --load-only): "
        "only the models whose languages are all in the list are served, and a multilingual "
        "model serves only the listed ones. Empty: every configured model.",
    )
    served_model_name: str = Field(
        "",
        description="The name the API reports for the one model served when a single "
        "export is (vLLM's --served-model-name); defaults to the export's model_name, else "
        "its directory name.",
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
    cpu_int8: bool = Field(
        True,
        description="On the CPU, serve the int8 variant an export carries (`<export>/int8`, "
        "written by `python -m export` and `models pull`) when the check recorded at export "
        "holds: its chrF on held-out strings within 0.3 of fp32's, and every held-out string "
        "translated alone as in a batch (activations are quantized row by row; the model card "
        "has the figures). Exports whose check fails or predates the batch check serve fp32. "
        "false: fp32 on the CPU too. GPUs always serve the export as it is (fp32 or fp16).",
    )
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

    @property
    def engine_threads(self) -> int:
        """ONNX Runtime intra-op threads for each engine (``intra_op_threads``, 0: auto)."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return cpu_budget().engine_threads

    @property
    def kv_pool_bytes(self) -> int:
        return self.kv_pool_mb << 20

    @field_validator("exports", "models", "load_only", mode="before")
    @classmethod
    def _split_lists(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
