"""The composition root: the one place where the settings become objects.

``Settings`` (service/config.py) is read here and in the web layer only. Everything below the
web layer takes its own group of it as it is: the model settings for the registry and each
engine, the batching settings for each batcher, the text limits for the translator and the
dispatcher; the ``GlossaryStore`` and ``MemoryStore`` live in the service's database (SQLite
under ``MT_DATA_DIR``, or the PostgreSQL database of ``MT_DATABASE_URL``).

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
from service.cpus import CpuBudget, cpu_budget
from service.engine_core.client import EngineCoreClient
from service.engine_core.control import find_cores
from service.engine_core.core import build_engine_core
from service.engine_core.plan import ProcessPlan
from service.metrics import ServiceMetrics
from service.runtime import heap
from service.runtime.engine import Engine, open_engine
from service.scheduling.turns import RoundRobinTurns
from service.storage.databases import Databases, open_databases
from service.storage.glossaries import GlossaryStore
from service.storage.memories import MemoryStore
from service.text.tokenizer import Tokenizer
from service.translation.detection import LanguageDetector
from service.translation.discovery import RegistryError, discover_models
from service.translation.dispatch import Dispatcher
from service.translation.exports import ModelSpec
from service.translation.plan_follower import PlanFollower
from service.translation.planning import RoutePlanner
from service.translation.registry import ModelRegistry
from service.translation.routing import source_languages
from service.translation.slots import LoadedModel, ModelLoader
from service.translation.translator import Translator
from service.web.access import AccessPolicy
from service.web.app import build_app
from service.web.lifecycle import ServiceState
from service.web.shared_limits import SharedRateLimiter

logger = logging.getLogger(__name__)

EngineLoader = Callable[[ModelSpec], Engine]


# --- the settings' derived values ------------------------------------------------------------


def oversubscribed(intra_op_threads: int, budget: CpuBudget) -> str | None:
    """Why an explicit ``MT_INTRA_OP_THREADS`` leaves no core to the event loop, or None.
    Threads of one parallel kernel then wait for each other while the OS runs the loop, so a
    step takes several times its cost (docs/engine.md), and the encoder thread (idle
    priority, on the loop's core) waits for a core, so the engine waits on the encoder."""
    if intra_op_threads <= budget.engine_threads:
        return None
    return (
        f"MT_INTRA_OP_THREADS={intra_op_threads} on {budget.cpus} usable CPUs leaves the HTTP "
        f"event loop and the encoder thread no core of their own; 0 (the default) gives "
        f"{budget.engine_threads}"
    )


def databases(settings: Settings) -> Databases:
    """SQLite under ``MT_DATA_DIR``, or the PostgreSQL database of ``MT_DATABASE_URL``
    (opened in the background: a database that is down makes /ready say 503)."""
    storage = settings.storage
    return open_databases(storage.data_dir, storage.database_url)


def stores(settings: Settings, opened: Databases) -> tuple[GlossaryStore, MemoryStore]:
    """The stored glossaries and translation memories, in one database."""
    return (
        GlossaryStore(opened.main, settings.access.max_glossary_entries),
        MemoryStore(opened.main, settings.limits.max_chars_per_text),
    )


# --- models ------------------------------------------------------------------------------------


def engine_loader(settings: Settings) -> EngineLoader:
    """Builds each model's engine from its export directory."""
    return lambda spec: open_engine(spec.model_dir, settings.model)


def model_loader(
    settings: Settings,
    metrics: ServiceMetrics,
    load_engine: EngineLoader,
    turns: RoundRobinTurns | None,
) -> ModelLoader:
    """Spec -> its engine core in this process (service/engine_core/core.py: the engine
    warmed up, its batcher not yet started) and its translator."""
    cpus = cpu_budget().cpus  # one process: every engine core shares the whole budget

    def load(spec: ModelSpec) -> LoadedModel:
        turn = partial(turns.turn, spec.model_id) if turns is not None else contextlib.nullcontext
        core = build_engine_core(
            spec.model_id,
            load_engine(spec),
            settings.scheduling,
            metrics.for_model(spec.model_id),
            max_chars_per_text=settings.limits.max_chars_per_text,
            cpus=cpus,
            turn=turn,
        )
        translator = Translator(
            Tokenizer.from_dir(spec.model_dir),
            core.batcher,
            settings.limits,
            spec.source_lang,
            model_positions=core.info.max_positions,
        )
        return LoadedModel(core.info, core.batcher, translator)

    return load


# How long a front-end waits for the first engine core of a model to answer (it loads meanwhile).
ENGINE_CORE_WAIT_S = 600.0


def engine_core_loader(
    settings: Settings, metrics: ServiceMetrics, plan: PlanFollower, supervisor: str = ""
) -> ModelLoader:
    """Spec -> a client of the model's engine cores (processes the supervisor started; those
    the plan names now, or their successors where a probed core or the supervisor says they
    retired) and its translator: the front-end's side of the multi-process mode."""

    def load(spec: ModelSpec) -> LoadedModel:
        model_id = spec.model_id
        addresses, pong = find_cores(model_id, plan, ENGINE_CORE_WAIT_S, supervisor)
        info = pong.info
        client = EngineCoreClient(
            addresses,
            info,
            metrics.for_model(model_id),
            on_moved=partial(plan.moved, model_id),
            supervisor=supervisor,
        )
        translator = Translator(
            Tokenizer.from_dir(spec.model_dir),
            client,
            settings.limits,
            spec.source_lang,
            model_positions=info.max_positions,
        )
        return LoadedModel(info, client, translator, core_addresses=tuple(addresses))

    return load


def dispatcher_factory(
    settings: Settings, registry: ModelRegistry, memories: MemoryStore | None = None
) -> Callable[[], Dispatcher]:
    """Builds the dispatcher, loading the language detector first (seconds: called off the
    event loop)."""

    def build() -> Dispatcher:
        detector = None
        if settings.model.language_detection:
            detector = LanguageDetector(source_languages(registry.by_pair))
            heap.trim()  # what reading the word lists freed (service/runtime/heap.py)
        planner = RoutePlanner(
            registry, detector, settings.limits, settings.model.pivot_lang, memories
        )
        return Dispatcher(planner)

    return build


def build_registry(
    settings: Settings,
    metrics: ServiceMetrics,
    load_engine: EngineLoader,
    engine_cores: ProcessPlan | None = None,
) -> ModelRegistry:
    model = settings.model
    specs = discover_models(
        model.exports, model.models_dir, model.served_model_name, model.load_only
    )
    fair = len(specs) > 1 and model.model_fairness == "round_robin"
    turns = RoundRobinTurns() if fair else None
    loader = model_loader(settings, metrics, load_engine, turns)
    freshness = follower = None  # a new revision installed: the registry loads it itself
    if engine_cores is not None:  # the engines run in engine-core processes
        # the supervisor loads a new revision in new engine cores; their old ones say when
        freshness = follower = PlanFollower(engine_cores)
        loader = engine_core_loader(settings, metrics, follower, engine_cores.supervisor)
    grace_s = settings.process.shutdown_grace_s
    registry = ModelRegistry(
        specs,
        model,
        metrics,
        loader,
        turns,
        shutdown_grace_s=grace_s,
        # a front-end swaps when woken by a move; the poll retries a swap whose load failed
        revision_poll_s=model.reload_poll_s,
        freshness=freshness,
    )
    if follower is not None:
        follower.wake = registry.revisions.wake
    return registry


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
    ``engine_cores``: the supervisor's plan, whose engine-core processes run the engines
    (followed as the supervisor moves models to new engine cores)."""
    settings = settings or get_settings()
    metrics = ServiceMetrics()
    budget = cpu_budget()
    metrics.cpus.labels(source=budget.source).set(budget.cpus)
    threads = settings.model.engine_threads
    plan = engine_cores or ProcessPlan(1, 1, threads, budget.cpus)
    for count, value in (
        ("frontends", plan.frontends),
        ("engine_replicas", plan.engine_replicas),
        ("intra_op_threads", plan.intra_op_threads),
    ):
        metrics.process_plan.labels(count=count).set(value)
    logger.info("%s; %d engine threads per model", budget.describe(), threads)
    if (warning := oversubscribed(settings.model.intra_op_threads, budget)) is not None:
        logger.warning("%s", warning)
    if load_engine is None:
        load_engine = engine_loader(settings) if engine is None else (lambda _spec: engine)
    opened = databases(settings)
    glossaries, memories = stores(settings, opened)
    try:
        registry = build_registry(settings, metrics, load_engine, engine_cores)
    except RegistryError as error:
        logger.error("%s", error)
        return build_app(
            ServiceState(
                settings,
                metrics,
                None,
                None,
                failure=str(error),
                databases=opened,
                glossaries=glossaries,
                memories=memories,
            )
        )
    factory = dispatcher_factory(settings, registry, memories)
    state = ServiceState(
        settings,
        metrics,
        registry,
        factory,
        databases=opened,
        glossaries=glossaries,
        memories=memories,
    )
    app = build_app(state)
    if engine_cores is not None or opened.shared_by_replicas:
        # Several front-ends, or replicas on one database: one rate-limit window for all.
        app.state.access = AccessPolicy(settings, limiter=SharedRateLimiter(opened.limits))
    return app
