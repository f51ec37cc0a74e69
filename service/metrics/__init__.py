"""Prometheus metrics, one registry per app (so tests and several apps in one process don't
collide), modelled on Triton's: request counts and latency by route and status, queue wait,
rows per decode step, decode steps, generated tokens, queue depth, in-flight rows,
rejections by reason, and the share of a core the encoder overlap's thread gets.

The gauges of a batcher's state (queue depth, in-flight rows) carry a ``model`` label: each
model has its own batcher, and one unlabelled gauge would hold whichever batcher wrote last.
A batcher writes through ``for_model``'s view, which has that model's children in their place;
``forget_model`` drops them when the model is unloaded. Counters and histograms stay summed
over models.

In the multi-process service the supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` for every child:
each process writes its values to files there (prometheus-client's multiprocess mode) and
``/metrics`` on any front-end reads them all, so the engine cores' steps, queue waits and batch
rows show beside every front-end's requests. Counters and histograms are summed over the
processes (dead ones included, so they never go back); each gauge says how its processes'
values combine (``multiprocess_mode``; ignored in one process). Thread CPU seconds, read from
schedstat at each scrape in one process, are published as counters there instead.

What a dashboard groups by (deploy/grafana/, alert rules in deploy/prometheus/): translations,
sentences, characters and latency per model and language pair (``mt_pair_*``; a pivot's
``model`` is its two models joined by ``+``); document jobs by state with the sentences they
have left (read from the jobs' store at each scrape); the serving phase and each engine
thread's liveness; and the process collector's ``process_*`` (CPU, memory, file descriptors).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from service.metrics.collectors import (
    DOCUMENT_STATES,
    PROC_TASKS,
    DocumentJobs,
    ThreadPublisher,
    ThreadSched,
    read_schedstat,
)
from service.metrics.engine import LATENCY_BUCKETS, EngineSeries

__all__ = [
    "DOCUMENT_STATES",
    "PROC_TASKS",
    "DocumentJobs",
    "ServiceMetrics",
    "ThreadPublisher",
    "ThreadSched",
    "multiprocess_dir",
    "read_schedstat",
]

PHASES = ("loading", "ready", "shutting_down", "failed")
_PAIR = ["model", "source", "target"]


def multiprocess_dir() -> str | None:
    """Where the processes of the multi-process service write their metrics, or None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class PairMetrics:
    """Translations, sentences, characters and latency by model and language pair (what a
    dashboard groups by)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.translations = Counter(
            "mt_pair_translations",
            "Translations (a request, or a chunk of a document or HTML fragment) by model and "
            "language pair.",
            _PAIR,
            registry=r,
        )
        self.sentences = Counter(
            "mt_pair_sentences",
            "Sentences translated, by model and language pair.",
            _PAIR,
            registry=r,
        )
        self.characters = Counter(
            "mt_pair_characters",
            "Source characters, by model and language pair.",
            _PAIR,
            registry=r,
        )
        self.latency = Histogram(
            "mt_pair_duration_seconds",
            "Time from a translation's start on its models to its result, by model and pair.",
            _PAIR,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._series: dict[tuple[str, str, str], tuple[Any, Any, Any, Any]] = {}

    def record(
        self, model: str, source: str, target: str, sentences: int, characters: int, seconds: float
    ) -> None:
        # Each (model, pair)'s four series, looked up once: ``labels()`` takes a lock and
        # checks its arguments on every call, four times a request on the event loop. The
        # series are never removed, and models and pairs are few.
        key = (model, source, target)
        series = self._series.get(key)
        if series is None:
            labels = {"model": model, "source": source, "target": target}
            series = self._series[key] = (
                self.translations.labels(**labels),
                self.sentences.labels(**labels),
                self.characters.labels(**labels),
                self.latency.labels(**labels),
            )
        translations, sentences_series, characters_series, latency = series
        translations.inc()
        sentences_series.inc(sentences)
        characters_series.inc(characters)
        latency.observe(seconds)


class ServiceMetrics(EngineSeries):
    """The service's metrics; the batcher and the HTTP layer both write to one instance."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.shared_dir = multiprocess_dir()
        super().__init__(r)
        self.requests = Counter(
            "mt_requests",
            "HTTP requests by route and status code.",
            ["route", "status"],
            registry=r,
        )
        self.request_latency = Histogram(
            "mt_request_duration_seconds",
            "HTTP request latency by route and status code.",
            ["route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.threads = ThreadSched()
        self.thread_publisher: ThreadPublisher | None = None
        if self.shared_dir is None:
            r.register(self.threads)
        else:
            self.thread_publisher = ThreadPublisher(self.threads, r)
        self.cache_hits = Counter("mt_cache_hits", "Sentences answered from the cache.", registry=r)
        self.memory_hits = Counter(
            "mt_memory_hits",
            "Segments (whole texts or sentences) written from a translation memory, without "
            "the model.",
            registry=r,
        )
        self.process_plan = Gauge(
            "mt_process_plan",
            "The process plan: HTTP front-ends, engine cores per model and intra-op "
            "threads per engine core (count); one of each in the one-process mode.",
            ["count"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.cpus = Gauge(
            "mt_cpus",
            "CPUs this process may use: the affinity mask capped by the cgroup CPU quota "
            "(source: affinity, cgroup v1 or cgroup v2).",
            ["source"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.inflight_requests = Gauge(
            "mt_inflight_requests",
            "Translation requests admitted and not yet answered (MT_MAX_INFLIGHT_REQUESTS).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.rejections = Counter(
            "mt_rejections",
            "Requests refused or abandoned, by reason.",
            ["reason"],
            registry=r,
        )
        self.models_loaded = Gauge(
            "mt_models_loaded", "Models loaded now.", registry=r, multiprocess_mode="livemax"
        )
        self.model_loads = Counter(
            "mt_model_loads", "Model loads by model and outcome.", ["model", "outcome"], registry=r
        )
        self.model_evictions = Counter(
            "mt_model_evictions", "Models unloaded to stay within MT_MAX_LOADED_MODELS.", registry=r
        )
        self.routes = Counter(
            "mt_routes",
            "Requests by kind of route (direct, pivot, identity).",
            ["kind"],
            registry=r,
        )
        self.pairs = PairMetrics(r)
        self.phase = Gauge(
            "mt_phase", "1 for the serving phase the process is in.", ["phase"], registry=r
        )
        self.engine_alive = Gauge(
            "mt_engine_alive",
            "1 while a loaded model's engine thread runs; 0 once it died (restart the process).",
            ["model"],
            registry=r,
        )
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes…

    def on_translation(
        self, model: str, source: str, target: str, sentences: int, characters: int, seconds: float
    ) -> None:
        """One translation finished on ``model`` (its id, or a pivot's ids joined by +)."""
        self.pairs.record(model, source, target, sentences, characters, seconds)

    def on_health(self, phase: str, engines_alive: dict[str, bool]) -> None:
        """The phase and each loaded model's engine thread, as a scrape finds them."""
        for name in PHASES:
            self.phase.labels(phase=name).set(1 if name == phase else 0)
        for model_id, alive in engines_alive.items():
            self.engine_alive.labels(model=model_id).set(1 if alive else 0)

    def watch_documents(self, read: Callable[[], dict[str, tuple[int, int]]]) -> None:
        """Report document jobs at each scrape: ``read()`` gives state -> (jobs, sentences
        left)."""
        self.registry.register(DocumentJobs(read))

    def forget_model(self, model_id: str) -> None:
        """Drop an unloaded model's gauges, so that /metrics lists only loaded models."""
        for gauge in (
            self.queue_depth,
            self.inflight_rows,
            self.row_limit,
            self.encoder_cpu_share,
            self.engine_alive,
        ):
            gauge.remove(model_id)  # a label set it does not hold is no error

    def render(self) -> bytes:
        """The exposition: this registry's, or every process's where they share a directory."""
        if self.shared_dir is None:
            return generate_latest(self.registry)
        if self.thread_publisher is not None:
            self.thread_publisher.publish()
        shared = CollectorRegistry()
        MultiProcessCollector(shared, self.shared_dir)
        return generate_latest(shared)
