"""The series the engine and its continuous batcher write: queue waits, rows per step and
admissions, decoder steps and calls, the engine thread's phases and busy time, tokens, errors,
and the gauges of a batcher's state, one child per model (``for_model``).
"""

from __future__ import annotations

import copy
from typing import Self

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class EngineSeries:
    """What a model's engine and batcher write, on registry ``r``; the service's metrics
    (``ServiceMetrics``) are these and the HTTP layer's and the process's."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.queue_wait = Histogram(
            "mt_queue_wait_seconds",
            "Time a sentence waited in the queue before joining the running batch.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "mt_batch_rows",
            "Rows (sentences x beams) in each decoder step.",
            buckets=_ROW_BUCKETS,
            registry=r,
        )
        self.admitted_rows = Histogram(
            "mt_batch_admitted_rows",
            "Rows joining the running batch at one step (steps with newcomers only).",
            buckets=_ROW_BUCKETS,
            registry=r,
        )
        self.admission_deferrals = Counter(
            "mt_admission_deferrals",
            "Steps at which the head of the queue was kept waiting: the batch's row or token "
            "budget, or the step-cost model (tokens/s would fall), said no.",
            registry=r,
        )
        self.admission_choice_cpu = Counter(
            "mt_admission_choice_cpu_seconds",
            "CPU seconds the engine thread spent choosing admissions (filling and judging "
            "them, deferrals included): on one core, capacity the decoder does not get.",
            registry=r,
        )
        self.encoder_lag_waits = Counter(
            "mt_encoder_lag_waits",
            "Times the engine thread stopped stepping to wait for an overlapped encoder call "
            "that had run longer than the lag bound (ENCODER_MAX_LAG_S: the idle-priority encoder thread "
            "was not getting a core).",
            registry=r,
        )
        self.decode_steps = Counter("mt_decode_steps", "Decoder steps run.", registry=r)
        self.decoder_calls = Counter(
            "mt_decoder_calls",
            "Decoder calls run: one per group of the batch and step (groups: age and length).",
            registry=r,
        )
        self.engine_busy = Counter(
            "mt_engine_busy_seconds",
            "Seconds the engine's threads spent admitting (encoder calls, merges) and stepping; "
            "its rate is how many cores' worth the engine keeps busy (above 1 when newcomers "
            "are encoded on the encoder thread while the running rows step).",
            registry=r,
        )
        self.engine_phase = Counter(
            "mt_engine_phase_seconds",
            "Wall seconds of the engine thread by phase: idle, wait (a coalescing window or an "
            "overlapped encoder call), turn, schedule, encode (in line), place, decoder, "
            "step_host, update (service/scheduling/timeline.py).",
            ["phase"],
            registry=r,
        )
        self.admission_stall = Histogram(
            "mt_admission_stall_seconds",
            "How long one admission stalled the running rows: its encoder call in line (no "
            "spare core) and its merge into the running groups.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.generated_tokens = Counter(
            "mt_generated_tokens",
            "Tokens generated (best hypothesis of each sentence).",
            registry=r,
        )
        self.input_tokens = Counter("mt_input_tokens", "Source tokens encoded.", registry=r)
        self.sentences = Counter("mt_sentences", "Sentences translated by the model.", registry=r)
        self.queue_depth = Gauge(
            "mt_queue_depth",
            "Sentences waiting for admission, by model.",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.inflight_rows = Gauge(
            "mt_inflight_rows",
            "Rows in the running batch, by model.",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.row_limit = Gauge(
            "mt_admission_row_limit",
            "Rows at which the learned step cost puts this machine's knee (cost-aware "
            "admission; 0 before the step-cost model is fitted), by model.",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.encoder_cpu_share = Gauge(
            "mt_encoder_cpu_share",
            "Share of a core the encoder thread got over its last window of 8 overlapped "
            "encodings (CPU time / wall time; the overlap assumes a whole core), by model.",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.engine_errors = Counter("mt_engine_errors", "Engine calls that raised.", registry=r)

    def for_model(self, model_id: str) -> Self:
        """The metrics as ``model_id``'s batcher writes them: the same registry and series,
        with ``queue_depth`` and ``inflight_rows`` that model's labelled gauges."""
        view = copy.copy(self)
        view.queue_depth = self.queue_depth.labels(model=model_id)
        view.inflight_rows = self.inflight_rows.labels(model=model_id)
        view.row_limit = self.row_limit.labels(model=model_id)
        view.encoder_cpu_share = self.encoder_cpu_share.labels(model=model_id)
        return view
