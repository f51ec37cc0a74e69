"""Collectors read at each scrape: the serving threads' CPU and run-queue seconds from
schedstat (``ThreadSched``; ``ThreadPublisher`` turns them into counters of the multiprocess
mode, which keeps no custom collectors), and document jobs by state (``DocumentJobs``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

DOCUMENT_STATES = ("queued", "translating", "done", "error", "cancelled")


PROC_TASKS = Path("/proc/self/task")  # one directory per thread of this process


def read_schedstat(tid: int, proc: Path = PROC_TASKS) -> tuple[float, float] | None:
    """``(CPU seconds, run-queue seconds)`` of thread ``tid`` so far; None where the kernel
    has no schedstat (not Linux, CONFIG_SCHED_INFO off) or the thread is gone."""
    try:
        fields = (proc / str(tid) / "schedstat").read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class ThreadSched(Collector):
    """``mt_thread_cpu_seconds`` and ``mt_thread_runqueue_seconds`` by thread role, read from
    schedstat at each scrape. A thread that exits keeps its last reading, so the counters
    never go back; several threads of one role (one engine thread per model) are summed."""

    def __init__(self, proc: Path = PROC_TASKS) -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._threads: dict[int, str] = {}  # native thread id -> role
        self._last: dict[int, tuple[float, float]] = {}

    def register(self, role: str, tid: int | None = None) -> None:
        """Count thread ``tid`` (the calling thread by default) under ``role``."""
        with self._lock:
            self._threads[tid if tid is not None else threading.get_native_id()] = role

    def readings(self) -> dict[str, tuple[float, float]]:
        """Role -> (CPU seconds, run-queue seconds), summed over its threads."""
        totals: dict[str, tuple[float, float]] = {}
        with self._lock:
            for tid, role in self._threads.items():
                reading = read_schedstat(tid, self._proc)
                if reading is not None:
                    self._last[tid] = reading
                cpu, queued = self._last.get(tid, (0.0, 0.0))
                before = totals.get(role, (0.0, 0.0))
                totals[role] = (before[0] + cpu, before[1] + queued)
        return totals

    def collect(self) -> Iterator[CounterMetricFamily]:
        readings = self.readings()
        cpu = CounterMetricFamily(
            "mt_thread_cpu_seconds",
            "CPU seconds of the serving threads by role (engine, encoder, event loop), from "
            "/proc/self/task/*/schedstat.",
            labels=["thread"],
        )
        queued = CounterMetricFamily(
            "mt_thread_runqueue_seconds",
            "Seconds the serving threads were runnable but waiting for a core (run-queue "
            "delay), by role, from /proc/self/task/*/schedstat.",
            labels=["thread"],
        )
        for role, (cpu_s, queued_s) in sorted(readings.items()):
            cpu.add_metric([role], cpu_s)
            queued.add_metric([role], queued_s)
        yield cpu
        yield queued


class ThreadPublisher:
    """``ThreadSched``'s readings as counters of the multiprocess mode, which keeps no custom
    collectors: each ``publish`` adds what this process's threads used since the last one
    (the engine core publishes every second, a front-end at each scrape)."""

    def __init__(self, threads: ThreadSched, registry: CollectorRegistry) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        self._published: dict[str, tuple[float, float]] = {}
        self.cpu = Counter(
            "mt_thread_cpu_seconds",
            "CPU seconds of the serving threads by role (engine, encoder, event loop), from "
            "/proc/<pid>/task/*/schedstat, summed over the processes.",
            ["thread"],
            registry=registry,
        )
        self.runqueue = Counter(
            "mt_thread_runqueue_seconds",
            "Seconds the serving threads were runnable but waiting for a core (run-queue "
            "delay), by role, summed over the processes.",
            ["thread"],
            registry=registry,
        )

    def publish(self) -> None:
        with self._lock:
            for role, (cpu_s, queued_s) in self._threads.readings().items():
                cpu_before, queued_before = self._published.get(role, (0.0, 0.0))
                self.cpu.labels(thread=role).inc(max(0.0, cpu_s - cpu_before))
                self.runqueue.labels(thread=role).inc(max(0.0, queued_s - queued_before))
                self._published[role] = (cpu_s, queued_s)


class DocumentJobs(Collector):
    """``mt_document_jobs`` by state and ``mt_document_sentences_left`` by state (the queue:
    what queued and translating jobs still have to translate), read at each scrape."""

    def __init__(self, read: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self._read()
        jobs = GaugeMetricFamily(
            "mt_document_jobs", "Document jobs in the store, by state.", labels=["state"]
        )
        left = GaugeMetricFamily(
            "mt_document_sentences_left",
            "Sentences document jobs have still to translate, by state (queued, translating).",
            labels=["state"],
        )
        for state in DOCUMENT_STATES:
            count, sentences = counts.get(state, (0, 0))
            jobs.add_metric([state], count)
            if state in ("queued", "translating"):
                left.add_metric([state], sentences)
        yield jobs
        yield left
