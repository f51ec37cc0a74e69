"""The composition root: the one place where the settings become objects.

``Settings`` (service/config.py) is read here and in the web layer only. Everything below the
web layer takes a small typed config built here: ``EngineConfig`` for the runtime,
``BatchingConfig`` for the scheduler, ``TextLimits`` and ``TranslatorConfig`` for the text
and translation layers, ``RegistryConfig`` for the model registry and routing, the
``GlossaryStore`` and ``MemoryStore`` in the SQLite file under ``MT_DATA_DIR``.

``create_app`` builds, in order: the metrics, the model registry (with a ``ModelLoader`` that
turns a model's spec into an engine, a batcher and a translator), the dispatcher factory (the
language detector is loaded in the background), and the FastAPI app around them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial

from fastapi import FastAPI

from service.config import Settings, get_settings
from service.engine_core.client import EngineCoreClient, probe
from service.engine_core.plan import ProcessPlan
from service.metrics import ServiceMetrics
from service.runtime.cpus import CpuBudget, cpu_budget
from service.runtime.engine import Engine, EngineConfig
from service.scheduling.batcher import BatchingConfig, ContinuousBatcher
from service.scheduling.turns import RoundRobinTurns
from service.text.pipeline import TextLimits
from service.text.tokenizer import Tokenizer
from service.translation.database import Database
from service.translation.detection import LanguageDetector
from service.translation.dispatch import Dispatcher
from service.translation.glossaries import GlossaryStore
from service.translation.memories import MemoryStore
from service.translation.registry import (
    LoadedModel,
    ModelLoader,
    ModelRegistry,
    ModelSpec,
    RegistryConfig,
    RegistryError,
    discover_models,
)
from service.translation.routing import source_languages
from service.translation.translator import Translator, TranslatorConfig
from service.web.app import build_app
from service.web.lifecycle import ServiceState

logger = logging.getLogger(__name__)

EngineLoader = Callable[[ModelSpec], Engine]


# --- settings -> typed configs ---------------------------------------------------------------


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(
        provider=settings.provider,
        intra_op_threads=settings.engine_threads(),
        kv_pool_bytes=settings.kv_pool_mb << 20,
        vocab_screen=settings.vocab_screen,
    )


def oversubscribed(intra_op_threads: int, budget: CpuBudget) -> str | None:
    """Why an explicit ``MT_INTRA_OP_THREADS`` leaves no core to the event loop, or None.
    Threads of one parallel kernel then wait for each other while the OS runs the loop, and
    the encoder thread (idle priority, on the loop's core) waits for a core: on 2 cores, 2
    threads made steps take 3-4x their cost (docs/engine.md) and kept the engine waiting on
    the encoder 40 % of the time (docs/benchmarks-log.md, 2026-11-24 documents)."""
    if intra_op_threads <= budget.engine_threads:
        return None
    return (
        f"MT_INTRA_OP_THREADS={intra_op_threads} on {budget.cpus} usable CPUs leaves the HTTP "
        f"event loop and the encoder thread no core of their own; 0 (the default) gives "
        f"{budget.engine_threads}"
    )


def batching_config(settings: Settings) -> BatchingConfig:
    # an encoder thread needs a core of its own: with one, it would only take turns
    encoder_overlap = settings.encoder_overlap and cpu_budget().cpus >= 2
    idle_wait_ms = settings.admission_idle_wait_ms
    if idle_wait_ms is None:
        idle_wait_ms = 0.0 if encoder_overlap else settings.static_max_wait_ms
    return BatchingConfig(
        max_batch_rows=settings.max_batch_rows,
        max_batch_tokens=settings.max_batch_tokens,
        max_queue=settings.max_queue,
        batching=settings.batching,
        static_max_wait_s=settings.static_max_wait_ms / 1000,
        idle_wait_s=idle_wait_ms / 1000,
        max_stall_steps=settings.admission_max_stall_steps,
        background_max_rows=settings.background_max_rows,
        background_max_wait_s=settings.background_max_wait_ms / 1000,
        cost_aware=settings.admission_cost_aware,
        cost_tolerance=settings.admission_cost_tolerance,
        max_admit_tokens=settings.admission_max_tokens,
        encoder_overlap=encoder_overlap,
        encoder_idle_priority=settings.encoder_idle_priority,
        encoder_max_lag_s=settings.encoder_max_lag_ms / 1000,
    )


def text_limits(settings: Settings) -> TextLimits:
    return TextLimits(
        max_texts_per_request=settings.max_texts_per_request,
        max_chars_per_text=settings.max_chars_per_text,
        max_input_tokens=settings.max_input_tokens,
        max_new_tokens=settings.max_new_tokens,
        output_length_ratio=settings.output_length_ratio,
        output_length_slack=settings.output_length_slack,
        max_beam_size=settings.max_beam_size,
        default_beam_size=settings.default_beam_size,
        length_penalty=settings.length_penalty,
    )


def translator_config(settings: Settings) -> TranslatorConfig:
    return TranslatorConfig(
        limits=text_limits(settings),
        request_timeout_s=settings.request_timeout_s,
        cache_size=settings.translation_cache_size,
    )


def stores(settings: Settings) -> tuple[GlossaryStore, MemoryStore]:
    """The stored glossaries and translation memories, sharing one SQLite file."""
    database = Database(settings.data_dir)
    return (
        GlossaryStore(database, settings.max_glossary_entries),
        MemoryStore(database, settings.max_chars_per_text),
    )


def registry_config(settings: Settings) -> RegistryConfig:
    return RegistryConfig(
        provider=settings.provider,
        lazy_load=settings.lazy_load,
        max_loaded_models=settings.max_loaded_models,
        cold_start=settings.cold_start,
        shutdown_grace_s=settings.shutdown_grace_s,
        pivot_lang=settings.pivot_lang,
    )


# --- models ------------------------------------------------------------------------------------


def engine_loader(settings: Settings) -> EngineLoader:
    """Builds each model's engine from its export directory."""
    config = engine_config(settings)
    return lambda spec: Engine.from_config(spec.model_dir, config)


def model_loader(
    settings: Settings,
    metrics: ServiceMetrics,
    load_engine: EngineLoader,
    turns: RoundRobinTurns | None,
) -> ModelLoader:
    """Spec -> a warmed-up engine, its batcher (not yet started) and its translator."""
    batching = batching_config(settings)
    translation = translator_config(settings)

    def load(spec: ModelSpec) -> LoadedModel:
        engine = load_engine(spec)
        engine.warmup()
        if batching.cost_aware and batching.batching == "continuous":
            engine.calibrate()
        turn = partial(turns.turn, spec.model_id) if turns is not None else contextlib.nullcontext
        batcher = ContinuousBatcher(
            engine, batching, metrics=metrics.for_model(spec.model_id), turn=turn
        )
        translator = Translator(
            Tokenizer.from_dir(spec.model_dir),
            batcher,
            translation,
            spec.source_lang,
            model_positions=engine.model.info.max_positions,
        )
        return LoadedModel(engine, batcher, translator)

    return load


# How long a front-end waits for the first engine core of a model to answer (it loads meanwhile).
ENGINE_CORE_WAIT_S = 600.0


def engine_core_loader(
    settings: Settings, metrics: ServiceMetrics, plan: ProcessPlan
) -> ModelLoader:
    """Spec -> a client of the model's engine cores (processes the supervisor started) and
    its translator: the front-end's side of the multi-process mode."""
    translation = translator_config(settings)

    def load(spec: ModelSpec) -> LoadedModel:
        addresses = plan.addresses[spec.model_id]
        info = probe(addresses, ENGINE_CORE_WAIT_S)
        client = EngineCoreClient(addresses, info, metrics.for_model(spec.model_id))
        translator = Translator(
            Tokenizer.from_dir(spec.model_dir),
            client,
            translation,
            spec.source_lang,
            model_positions=info.max_positions,
        )
        return LoadedModel(info, client, translator)

    return load


def dispatcher_factory(
    settings: Settings, registry: ModelRegistry, memories: MemoryStore | None = None
) -> Callable[[], Dispatcher]:
    """Builds the dispatcher, loading the language detector first (seconds: called off the
    event loop)."""

    def build() -> Dispatcher:
        detector = None
        if settings.language_detection:
            detector = LanguageDetector(source_languages(registry.by_pair))
        return Dispatcher(registry, detector, text_limits(settings), settings.pivot_lang, memories)

    return build


def build_registry(
    settings: Settings,
    metrics: ServiceMetrics,
    load_engine: EngineLoader,
    engine_cores: ProcessPlan | None = None,
) -> ModelRegistry:
    specs = discover_models(
        settings.model_dirs, settings.models_dir, settings.model_dir, settings.model_name
    )
    fair = len(specs) > 1 and settings.model_fairness == "round_robin"
    turns = RoundRobinTurns() if fair else None
    loader = model_loader(settings, metrics, load_engine, turns)
    if engine_cores is not None:  # the engines run in engine-core processes (issue 53)
        loader = engine_core_loader(settings, metrics, engine_cores)
    return ModelRegistry(specs, registry_config(settings), metrics, loader, turns)


# --- the app -----------------------------------------------------------------------------------


def create_app(
    settings: Settings | None = None,
    engine: Engine | None = None,
    load_engine: EngineLoader | None = None,
    engine_cores: ProcessPlan | None = None,
) -> FastAPI:
    """The service as an ASGI app. Models are found from the settings and loaded in the
    background after start-up. ``engine``: an already built engine for a single model;
    ``load_engine``: builds each model's engine from its spec (tests wrap engines this way);
    ``engine_cores``: the supervisor's plan, whose engine-core processes run the engines."""
    settings = settings or get_settings()
    metrics = ServiceMetrics()
    budget = cpu_budget()
    metrics.cpus.labels(source=budget.source).set(budget.cpus)
    plan = engine_cores or ProcessPlan(1, 1, settings.engine_threads(), budget.cpus)
    for count, value in (
        ("frontends", plan.frontends),
        ("engine_replicas", plan.engine_replicas),
        ("intra_op_threads", plan.intra_op_threads),
    ):
        metrics.process_plan.labels(count=count).set(value)
    logger.info("%s; %d engine threads per model", budget.describe(), settings.engine_threads())
    if (warning := oversubscribed(settings.intra_op_threads, budget)) is not None:
        logger.warning("%s", warning)
    if load_engine is None:
        load_engine = engine_loader(settings) if engine is None else (lambda _spec: engine)
    glossaries, memories = stores(settings)
    try:
        registry = build_registry(settings, metrics, load_engine, engine_cores)
    except RegistryError as error:
        logger.error("%s", error)
        return build_app(
            ServiceState(
                settings,
                metrics,
                text_limits(settings),
                None,
                None,
                failure=str(error),
                glossaries=glossaries,
                memories=memories,
            )
        )
    factory = dispatcher_factory(settings, registry, memories)
    state = ServiceState(
        settings,
        metrics,
        text_limits(settings),
        registry,
        factory,
        glossaries=glossaries,
        memories=memories,
    )
    return build_app(state)
