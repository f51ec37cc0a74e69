"""Continuous (iteration-level) batching: one engine thread serves every HTTP request.

The engine is not thread-safe and a decoder step is the unit of work, so one thread owns it
and loops::

    drop rows whose requests were cancelled
    admit queued sentences (rows and padded-token budget, length-aware)  -> engine.add
    one decoder step over every active row                              -> engine.step
    resolve the futures of the rows that finished

A sentence that arrives while others decode joins at the next step; a finished row leaves
at once, so a short request never waits for an unrelated long one. The event loop never
runs inference: ``submit`` puts jobs in the queue and awaits asyncio futures that the engine
thread resolves with ``loop.call_soon_threadsafe``.

The batcher works on token ids; text (segmenting, placeholders, tokenizing) is the
translator's business (service/translation/translator.py).

Two admission policies (``MT_BATCHING``), one loop; only *when* admission is open differs:

``continuous`` (default)
    Admission is open at every step, as above.
``static``
    The request-level "dynamic batcher" of Triton and most serving stacks, kept as a baseline
    to measure the continuous policy against (``python -m loadtest compare``). While the
    engine is idle, queued sentences wait until ``max_batch_rows`` rows are queued or the
    oldest has waited ``static_max_wait_s`` (``MT_STATIC_MAX_WAIT_MS``, like Triton's
    ``max_queue_delay_microseconds``); then one batch is admitted (same row and token
    budgets) and stepped until every row in it has finished, with admission closed: a
    sentence that arrives meanwhile waits for the whole batch, however long its longest row.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from service.errors import EngineFailure, InvalidRow, NotAccepting, QueueFull
from service.metrics import ServiceMetrics
from service.runtime.engine import BatchEstimate, DecodeRequest, FinishedRequest, RejectedRequest

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

BatchingPolicy = Literal["continuous", "static"]
T = TypeVar("T")


class DecodeEngine(Protocol):
    """What the batcher needs of ``service.runtime.engine.Engine``. An engine that also has
    ``encode`` and ``place`` (``add`` in two halves) gets the encoder overlap."""

    steps: int
    active_rows: int

    def add(self, requests: list[DecodeRequest]) -> list[RejectedRequest]: ...
    def step(self) -> list[FinishedRequest]: ...
    def drop(self, request_ids: Iterable[Hashable]) -> None: ...
    def estimate(self, newcomers: Sequence[tuple[int, int]] = ()) -> BatchEstimate: ...


@dataclass(frozen=True)
class BatchingConfig:
    """Every scheduling knob of the batcher (built from the settings by service/wiring.py)."""

    max_batch_rows: int = 64
    max_batch_tokens: int = 8192
    max_queue: int = 256
    batching: BatchingPolicy = "continuous"
    static_max_wait_s: float = 0.01
    admission_ratio: float = 0.25
    admission_max_wait_s: float = 0.005
    admission_window: int | None = None  # default: 4 x max_batch_rows
    # Cost-aware admission (continuous): newcomers join only while the batch stays within the
    # row count at which the engine's learned step cost puts this machine's knee (the most
    # rows whose tokens/s are within ``cost_tolerance`` of the best).
    cost_aware: bool = True
    cost_tolerance: float = 0.05
    # Source tokens encoded per step for newcomers: bounds how long running rows wait for an
    # admission's encoder calls (an empty batch always takes the head of the queue).
    max_admit_tokens: int = 1024
    # Continuous: encode newcomers on a second thread while the running rows step (an engine
    # with ``encode``/``place``); they join once encoded, one admission in flight at a time.
    encoder_overlap: bool = True
    # The encoder thread runs at the OS's idle priority (Linux SCHED_IDLE): on busy cores the
    # decoder steps and the event loop go first and newcomers' encoder calls take what is
    # left. ``encoder_max_lag_s`` bounds what that costs a newcomer: an encoder call in
    # flight longer than that has the engine thread stop stepping and wait for it, which
    # frees the engine thread's core for it (0: never).
    encoder_idle_priority: bool = True
    encoder_max_lag_s: float = 0.15



def _idle_priority_for_this_thread() -> None:
    """Put the calling thread in the SCHED_IDLE class (Linux schedules threads on their own;
    lowering one's own priority needs no privilege). A waking thread takes a core that runs
    only SCHED_IDLE work as if it were free. Elsewhere, or where it is refused, the thread
    keeps its priority."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as error:
        logger.warning("the encoder thread keeps its priority (SCHED_IDLE refused: %s)", error)


class EncoderCpuShare:
    """The share of a core the encoder thread gets while the running rows step.

    The encoder overlap assumes that the encoder thread and the engine thread each have a
    core. ONNX Runtime with one intra-op thread computes in the calling thread, so the
    encoder thread's CPU time over wall time around its encoder call (``time.thread_time`` /
    ``time.perf_counter``) is the share of a core it actually got; waits for the GIL count
    as not running. Over every ``window`` overlapped encodings the share is sum(cpu) /
    sum(wall) (``mt_encoder_cpu_share``; a histogram of the windows goes to the log at close).
    With several intra-op threads it is the calling thread's share, a lower bound of the pool's.

    The share is reported, not acted on: on busy shared cores it falls because the load
    generator takes the cores, which standing the overlap down does not cure
    (docs/benchmarks-log.md has the runs).

    ``timed`` runs on the encoder thread and touches no state; ``record`` and ``summary`` are
    the engine thread's. The clocks are arguments for the tests.
    """

    def __init__(
        self,
        window: int = 8,
        *,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self._cpu_clock = cpu_clock
        self._wall_clock = wall_clock
        self._cpu_s = 0.0  # this window's encoder CPU seconds
        self._wall_s = 0.0  # and wall seconds
        self._encodings = 0  # encodings in this window
        self.windows_by_tenth = [0] * 11  # whole windows by share, in tenths of a core

    def timed(self, work: Callable[[], T]) -> tuple[T, float, float]:
        """``work()``, with the CPU and wall seconds of the calling thread it took."""
        cpu_started, wall_started = self._cpu_clock(), self._wall_clock()
        result = work()
        return result, self._cpu_clock() - cpu_started, self._wall_clock() - wall_started

    def record(self, cpu_s: float, wall_s: float) -> float | None:
        """One overlapped encoding's CPU and wall seconds; the window's share of a core when
        this encoding completes a window, else None."""
        self._cpu_s += cpu_s
        self._wall_s += wall_s
        self._encodings += 1
        if self._encodings < self.window:
            return None
        share = min(1.0, self._cpu_s / self._wall_s) if self._wall_s > 0 else 1.0
        self.windows_by_tenth[int(share * 10)] += 1
        self._cpu_s = self._wall_s = 0.0
        self._encodings = 0
        return share

    def summary(self) -> str:
        """One line for the log: how many windows got which share of a core."""
        shares = " ".join(
            f"{tenth / 10:.1f}:{count}"
            for tenth, count in enumerate(self.windows_by_tenth)
            if count
        )
        return (
            f"{sum(self.windows_by_tenth)} windows of {self.window} overlapped encodings, "
            f"by share of a core the encoder thread got [{shares or '-'}]"
        )


class _PlanByEstimate:
    """``Engine.plan`` for an engine that has only ``estimate``: the whole list each time."""

    def __init__(self, engine: DecodeEngine, max_rows: int, tolerance: float) -> None:
        self._engine = engine
        self._max_rows = max_rows
        self._tolerance = tolerance
        self._taken: list[tuple[int, int]] = []

    def estimate(self, newcomers: Sequence[tuple[int, int]]) -> BatchEstimate:
        return self._engine.estimate([*self._taken, *newcomers], self._max_rows, self._tolerance)

    def take(self, newcomers: Sequence[tuple[int, int]]) -> None:
        self._taken.extend(newcomers)



@dataclass(frozen=True)
class RowResult:
    tokens: list[int]
    admitted_step: int  # engine.steps when the row joined the batch (before its first step)
    finished_step: int  # engine.steps after the step that finished it
    queue_wait_s: float
    hypotheses: list[list[int]] = field(default_factory=list)  # n-best (beam), best first


@dataclass
class _Encoding:
    """An admission whose encoder call runs on the encoder thread."""

    jobs: list[_Job]
    future: Future  # -> EncodedRequests
    admitted_at: float  # when admission chose the jobs (their queue wait ends there)

    @property
    def job_ids(self) -> set[int]:
        return {job.job_id for job in self.jobs}


@dataclass(eq=False)
class _Job:
    """One sentence from submission to result."""

    job_id: int
    row: DecodeRequest  # request_id == job_id
    future: asyncio.Future[RowResult]
    loop: asyncio.AbstractEventLoop
    enqueued_at: float = field(default_factory=time.monotonic)
    admitted_step: int = -1
    queue_wait_s: float = 0.0
    # The sentences of one ``submit`` call (a paragraph, a list of texts) form one unit,
    # admitted together where it fits: a request does not wait for its last sentence to
    # trickle into the batch (its latency is its slowest sentence's).
    unit: int = -1

    @property
    def rows(self) -> int:
        return self.row.beam_size

    @property
    def src_len(self) -> int:
        return len(self.row.src_ids)


class ContinuousBatcher:
    """Iteration-level scheduler in front of one engine.

    ``max_batch_rows`` bounds rows per decoder step; ``max_batch_tokens`` bounds the padded
    source of the running batch (rows x longest source), which is what the cross-attention
    keys/values and the encoder cost; ``max_queue`` bounds waiting sentences (beyond it
    ``submit`` raises :class:`QueueFull` at once rather than letting latency grow).

    ``batching`` picks the admission policy (see the module docstring); ``static_max_wait_s``
    is the static policy's longest wait for a full batch. Left as None, both come from the
    ``MT_BATCHING`` and ``MT_STATIC_MAX_WAIT_MS`` settings.
    """

    def __init__(
        self,
        engine: DecodeEngine,
        config: BatchingConfig | None = None,
        *,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        turn: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        encoder_share: EncoderCpuShare | None = None,
        **overrides,
    ) -> None:
        """``config``: the scheduling knobs (default ``BatchingConfig()``); ``overrides``:
        fields of it to replace (tests, scripts). ``encoder_share``: measures the encoder
        thread's share of a core (tests pass one with their own clocks)."""
        config = replace(config or BatchingConfig(), **overrides)
        if config.batching not in ("continuous", "static"):
            raise ValueError(f"unknown batching policy {config.batching!r}")
        self.config = config
        self.engine = engine
        # Several models on one device take turns (service/scheduling/turns.py): the engine thread
        # holds a turn around each admission + step.
        self._turn = turn
        self.max_batch_rows = config.max_batch_rows
        self.max_batch_tokens = config.max_batch_tokens
        self.max_queue = config.max_queue
        self.batching: BatchingPolicy = config.batching
        self.static_max_wait_s = config.static_max_wait_s
        self.admission_ratio = config.admission_ratio
        self.admission_max_wait_s = config.admission_max_wait_s
        self._clock = clock
        self.metrics = metrics if metrics is not None else ServiceMetrics().for_model("default")
        # How far past the head of the queue admission looks for sentences that fit the
        # running batch's width; bounded, so a sentence is overtaken only so often.
        self.admission_window = config.admission_window or 4 * config.max_batch_rows

        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()  # guarded by _cond
        self._to_drop: set[int] = set()  # guarded by _cond
        self._accepting = True  # guarded by _cond
        self._stopping = False  # guarded by _cond
        self._running: dict[int, _Job] = {}  # engine thread only (read under _cond elsewhere)
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._death: BaseException | None = None  # why the engine thread died, if it did
        # Encoder overlap: the admission being encoded on the encoder thread, if any.
        self._overlap = (
            config.encoder_overlap
            and config.batching == "continuous"
            and hasattr(engine, "encode")
            and hasattr(engine, "place")
        )
        self._encoder: ThreadPoolExecutor | None = None
        self._encoding: _Encoding | None = None  # engine thread only
        self._encoder_share = encoder_share or EncoderCpuShare()

    # --- event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
            self._thread.start()
            logger.info(
                "batching: %s%s",
                self.batching,
                f" (max wait {self.static_max_wait_s * 1000:g} ms)"
                if self.batching == "static"
                else "",
            )

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def encoded_waiting_to_join(self) -> bool:
        """An admission's encoder call has finished on the encoder thread; its rows join the
        batch at the next step boundary."""
        encoding = self._encoding
        return encoding is not None and encoding.future.done()

    async def submit(
        self, rows: Sequence[DecodeRequest], timeout_s: float | None = None
    ) -> list[RowResult]:
        """Decode ``rows``; results in the same order.

        All rows of one call enter the queue together or not at all (:class:`QueueFull`).
        On timeout (``TimeoutError``) or cancellation (client gone) the rows still queued
        leave the queue and the rows in the batch are dropped from the engine.
        """
        if not rows:
            return []
        jobs = self._enqueue(rows)
        try:
            async with asyncio.timeout(timeout_s):
                return list(await asyncio.gather(*(job.future for job in jobs)))
        except BaseException:
            self._abandon(jobs)
            raise

    def submit_as_completed(
        self, rows: Sequence[DecodeRequest], timeout_s: float | None = None
    ) -> RowStream:
        """Queue ``rows`` now (all or none: :class:`QueueFull`, :class:`NotAccepting` raise
        here, before any result) and return an async iterator of ``(index in rows, result)``
        in the order the rows finish: streaming responses send a sentence as soon as it is
        done.

        Same clean-up as :meth:`submit`: when the iteration stops early (``aclose()``, the
        consumer is cancelled, a row fails, or ``timeout_s`` passes: ``TimeoutError``), rows
        still queued leave the queue and rows in the batch are dropped at once.
        """
        return RowStream(self, self._enqueue(rows) if rows else [], timeout_s)

    def _enqueue(self, rows: Sequence[DecodeRequest]) -> list[_Job]:
        """Put one job per row in the queue, all or none (:class:`QueueFull`)."""
        loop = asyncio.get_running_loop()
        now = self._clock()
        jobs: list[_Job] = []
        for row in rows:
            job_id = next(self._ids)
            request = replace(row, request_id=job_id, src_ids=tuple(row.src_ids))
            unit = jobs[0].job_id if jobs else job_id
            jobs.append(
                _Job(job_id, request, loop.create_future(), loop, enqueued_at=now, unit=unit)
            )
        with self._cond:
            if self._death is not None:
                raise NotAccepting("engine_stopped")
            if not self._accepting:
                raise NotAccepting("shutting_down")
            if len(self._queue) + len(jobs) > self.max_queue:
                raise QueueFull(
                    f"the queue is full ({len(self._queue)} of MT_MAX_QUEUE={self.max_queue} "
                    f"sentences waiting; this request has {len(jobs)})"
                )
            self._queue.extend(jobs)
            self.metrics.queue_depth.set(len(self._queue))
            self._idle.clear()
            self._cond.notify()
        return jobs

    def begin_shutdown(self) -> None:
        """Refuse new work from now on; what is queued or decoding goes on."""
        with self._cond:
            self._accepting = False

    async def shutdown(self, grace_s: float) -> bool:
        """Stop admitting, let queued and running work finish for up to ``grace_s`` seconds,
        then fail whatever is left and stop the engine thread. Returns whether it drained."""
        self.begin_shutdown()
        drained = await asyncio.to_thread(self._idle.wait, grace_s)
        await asyncio.to_thread(self.close)
        return drained

    def close(self, join_timeout_s: float = 10.0) -> None:
        """Stop the engine thread after its current step; unfinished requests fail with
        :class:`NotAccepting`."""
        with self._cond:
            self._accepting = False
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            # A step that never returns (a hung device) must not keep the process alive:
            # the thread is a daemon, so giving up on it lets the process exit.
            self._thread.join(join_timeout_s)
            if self._thread.is_alive():
                logger.error("the engine thread did not stop within %.0f s", join_timeout_s)

    def _abandon(self, jobs: Sequence[_Job]) -> None:
        # Cancelling the gather has already cancelled the futures: "unfinished" is every job
        # without a result or an error of its own.
        unfinished = {job.job_id for job in jobs if job.future.cancelled() or not job.future.done()}
        for job in jobs:
            job.future.cancel()
        if not unfinished:
            return
        with self._cond:
            queued_before = len(self._queue)
            self._queue = deque(job for job in self._queue if job.job_id not in unfinished)
            removed_from_queue = queued_before - len(self._queue)
            if removed_from_queue < len(unfinished):
                # Some are in the batch (or being admitted): the engine thread drops them.
                self._to_drop.update(unfinished)
            self.metrics.queue_depth.set(len(self._queue))
            self._cond.notify()

    # --- engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:
            # A bug in the loop itself (engine errors inside add/step are caught there): the
            # thread is gone, so nothing would ever resolve the futures. Fail them all now,
            # refuse new work, and let ``alive`` tell the health checks.
            logger.critical("the engine thread died", exc_info=error)
            self._fail_everything_after_death(error)

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running (False after it died; True before start)."""
        thread = self._thread
        return self._death is None and (thread is None or thread.is_alive() or self._stopping)

    def _fail_everything_after_death(self, error: BaseException) -> None:
        with self._cond:
            self._death = error
            self._accepting = False
            leftovers = list(self._queue) + list(self._running.values())
            if self._encoding is not None:
                leftovers += self._encoding.jobs
                self._encoding = None
            self._queue.clear()
            self._running.clear()
        for job in leftovers:
            self._fail(job, EngineFailure(f"the engine thread stopped ({type(error).__name__})"))
        self.metrics.queue_depth.set(0)
        self._idle.set()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not (self._running or self._encoding or self._to_drop or self._stopping):
                    if not self._queue:
                        self._idle.set()
                        self._cond.wait()
                    elif (wait_s := self._admission_wait_locked()) > 0:
                        self._cond.wait(wait_s)  # a submit wakes it earlier
                    else:
                        break
                if self._stopping:
                    leftovers = list(self._queue) + list(self._running.values())
                    if self._encoding is not None:
                        leftovers += self._encoding.jobs
                    self._queue.clear()
                    break
                dropped = [job_id for job_id in self._to_drop if job_id in self._running]
                # ids of an admission still being encoded are dropped once it has joined
                encoding_ids = self._encoding.job_ids if self._encoding is not None else set()
                self._to_drop = {job_id for job_id in self._to_drop if job_id in encoding_ids}
                admit = self._encoding is None and self._admission_open_locked()
                newcomers = self._admit_locked(dropped) if admit else []
                self.metrics.queue_depth.set(len(self._queue))
            if dropped:
                self._drop(dropped)
            if newcomers or self._running or self._encoding:
                with self._turn():
                    if self._encoding is not None and (
                        not self._running or self._encoder_lagging()
                    ):
                        # nothing to step meanwhile, or the encoder call is not getting a
                        # core: the engine thread waits for the encoder thread, whose time is
                        # counted as busy already (``_encode_ahead``)
                        futures.wait([self._encoding.future])
                    busy_since = time.perf_counter()
                    if self._encoding is not None and self._encoding.future.done():
                        self._place_encoded()
                    if newcomers:
                        if self._overlap and self._running:
                            self._encode_ahead(newcomers)
                        else:
                            self._add(newcomers)
                    if self._running:
                        self._step()
                    self.metrics.engine_busy.inc(time.perf_counter() - busy_since)
        self._drop(list(self._running))
        if self._encoder is not None:
            self._encoder.shutdown(wait=False)
        if self._overlap:
            logger.info("encoder overlap: %s", self._encoder_share.summary())
        for job in leftovers:
            self._fail(job, NotAccepting("shutting_down"))
        self.metrics.queue_depth.set(0)
        self._idle.set()

    def _admission_wait_locked(self) -> float:
        """Seconds until the queue may be admitted into an idle engine (holds ``_cond``; the
        queue is not empty). Continuous: at once. Static: once ``max_batch_rows`` rows are
        queued or the oldest queued sentence has waited ``static_max_wait_s``."""
        if self.batching == "continuous":
            return 0.0
        if sum(job.rows for job in self._queue) >= self.max_batch_rows:
            return 0.0
        due = self._queue[0].enqueued_at + self.static_max_wait_s
        return max(0.0, due - self._clock())

    def _admission_open_locked(self) -> bool:
        """Whether queued sentences may join the batch at this step (holds ``_cond``).
        Continuous: always. Static: only into an idle engine, once the batch is due; the
        running batch takes no one until all of its rows have finished."""
        if not self._queue:
            return False
        if self.batching == "static":
            return not self._running and self._admission_wait_locked() <= 0
        # Continuous: every admission costs an encoder call and a copy of the whole running
        # cache (rows x (P + S)), so newcomers are coalesced while the batch is busy: admit
        # into an empty batch at once, else once the queued rows are a fair share of the
        # running ones (or would fill the batch), or the oldest has waited a short bound.
        running = sum(job.rows for job in self._running.values())
        if running == 0:
            return True
        queued = sum(job.rows for job in self._queue)
        room = self.max_batch_rows - running
        if self.config.cost_aware and (knee := self._knee_locked()) is not None:
            # At the knee a backlog joins only as rows retire. Admitting the one or two rows
            # that retire at every step would pay an encoder call and a merge of the whole
            # cache at every step for them; wait until a fair share of the knee is free.
            room = max(0, min(room, knee - running))
            if queued > room:
                if room >= max(1.0, self.admission_ratio * knee):
                    return True
                self.metrics.admission_deferrals.inc()
                return False
        return (
            queued >= self.admission_ratio * running
            or queued >= room
            or self._clock() - self._queue[0].enqueued_at >= self.admission_max_wait_s
        )

    def _knee_locked(self) -> int | None:
        """Rows at which the running batch's predicted tokens/s peak (None: no model yet)."""
        return self.engine.estimate((), self.max_batch_rows, self.config.cost_tolerance).row_limit

    def _admit_locked(self, dropped: Sequence[int]) -> list[_Job]:
        """Choose the queued sentences that join the batch at this step (holds ``_cond``).

        Whole units (the sentences of one request) join together. The head of the queue
        goes first whenever it fits, so nothing starves. Within the admission window, units
        that do not widen the padded batch are preferred (less padding for every row), then
        the others in arrival order, while rows, padded tokens (``engine.estimate``: sources
        and self-attention pasts, as the engine would group them) and the newcomers' encoder
        work stay within budget, and, with ``cost_aware``, while the batch stays within the
        knee the engine's learned step cost puts on this machine (``BatchEstimate.row_limit``):
        past it a bigger batch makes every running row slower and finishes nothing sooner.
        A unit that could not fit even a batch of its own (more rows than the budget or the
        knee) joins sentence by sentence.
        """
        if not self._queue:
            return []
        config = self.config
        staying = [job for job_id, job in self._running.items() if job_id not in dropped]
        rows = sum(job.rows for job in staying)
        width = max((job.src_len for job in staying), default=0)
        # The batch as it fills: each try costs O(groups), whatever was taken before.
        plan = (
            self.engine.plan(self.max_batch_rows, config.cost_tolerance)
            if hasattr(self.engine, "plan")
            else _PlanByEstimate(self.engine, self.max_batch_rows, config.cost_tolerance)
        )
        encode_tokens = 0
        judge_cost = config.cost_aware and self.batching == "continuous"
        chosen: list[_Job] = []
        over_knee = False  # the last unit tried would have taken the batch past the knee

        def fits(jobs: Sequence[_Job]) -> BatchEstimate | None:
            """The batch estimate with ``jobs`` admitted too, or None if they may not join."""
            nonlocal over_knee
            over_knee = False
            if rows + sum(job.rows for job in jobs) > self.max_batch_rows:
                return None
            if chosen and encode_tokens + sum(job.src_len for job in jobs) > (
                config.max_admit_tokens
            ):
                return None
            estimate = plan.estimate([(job.rows, job.src_len) for job in jobs])
            if estimate.padded_tokens > self.max_batch_tokens:
                return None
            if (
                judge_cost
                and (staying or chosen)  # an empty batch always takes the head
                and estimate.row_limit is not None
                and estimate.rows > estimate.row_limit
            ):
                over_knee = True
                return None
            return estimate

        def take(jobs: Sequence[_Job]) -> None:
            nonlocal rows, width, encode_tokens
            plan.take([(job.rows, job.src_len) for job in jobs])
            for job in jobs:
                chosen.append(job)
                rows += job.rows
                width = max(width, job.src_len)
                encode_tokens += job.src_len

        def splits(unit: list[_Job], knee: int | None) -> bool:
            """A unit too big to ever join whole: it joins sentence by sentence."""
            limit = self.max_batch_rows
            if judge_cost and knee is not None:
                limit = min(limit, knee)
            return sum(job.rows for job in unit) > limit

        units: dict[int, list[_Job]] = {}
        for job in itertools.islice(self._queue, 0, 1 + self.admission_window):
            units.setdefault(job.unit, []).append(job)
        head, *others = units.values()
        if fits(head) is not None:
            take(head)
        else:
            # An empty batch takes the head sentence even past the budgets: a sentence that
            # passed the request limits must run, whatever the batch settings.
            if not staying:
                take(head[:1])
            if not chosen and not splits(head, self._knee_locked()):
                self.metrics.admission_deferrals.inc()
                return []
            for job in head[len(chosen) :]:
                if fits([job]) is not None:
                    take([job])
            if not chosen:
                self.metrics.admission_deferrals.inc()
                return []
        # stable sort: arrival order kept among units that widen the batch and among the rest
        misses = 0
        for unit in sorted(others, key=lambda unit: max(job.src_len for job in unit) > width):
            if rows >= self.max_batch_rows or misses >= self.MAX_ADMISSION_MISSES:
                break
            if fits(unit) is not None:
                take(unit)
                misses = 0
            elif over_knee and len(unit) == 1 and unit[0].rows == 1:
                break  # one row already passes the knee: so would every other unit
            else:
                misses += 1
        chosen_ids = {job.job_id for job in chosen}
        self._queue = deque(job for job in self._queue if job.job_id not in chosen_ids)
        return chosen

    # Units that may be tried in a row without one fitting before admission stops looking:
    # admission runs between two steps, so its scan of a long queue must stay short.
    MAX_ADMISSION_MISSES = 8

    def _add(self, newcomers: list[_Job]) -> None:
        admitted_step = self.engine.steps
        now = self._clock()
        try:
            rejected = self.engine.add([job.row for job in newcomers])
        except Exception as error:
            self._fail_admission(newcomers, error)
            return
        self._admitted(newcomers, rejected, admitted_step, now)

    def _encode_ahead(self, newcomers: list[_Job]) -> None:
        """Start the newcomers' encoder call on the encoder thread; the running rows go on
        stepping and the newcomers join when it is done (``_place_encoded``)."""
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(
                1,
                thread_name_prefix="encoder",
                initializer=(
                    _idle_priority_for_this_thread if self.config.encoder_idle_priority else None
                ),
            )
        rows = [job.row for job in newcomers]

        def encode():  # timed as engine work: it is the engine's, on another thread
            started = time.perf_counter()
            try:  # -> (encoded, CPU seconds, wall seconds)
                return self._encoder_share.timed(lambda: self.engine.encode(rows))
            finally:
                self.metrics.engine_busy.inc(time.perf_counter() - started)

        self._encoding = _Encoding(newcomers, self._encoder.submit(encode), self._clock())

    def _encoder_lagging(self) -> bool:
        """Whether the encoder call in flight has run past ``encoder_max_lag_s`` (engine
        thread). Counted when it has: the engine thread is about to wait for it."""
        max_lag_s = self.config.encoder_max_lag_s
        if max_lag_s <= 0 or self._encoding.future.done():
            return False
        if self._clock() - self._encoding.admitted_at <= max_lag_s:
            return False
        self.metrics.encoder_lag_waits.inc()
        return True

    def _place_encoded(self) -> None:
        """The admission encoded on the encoder thread joins the batch."""
        encoding, self._encoding = self._encoding, None
        try:
            encoded, cpu_s, wall_s = encoding.future.result()
            if (share := self._encoder_share.record(cpu_s, wall_s)) is not None:
                self.metrics.encoder_cpu_share.set(share)
            self.engine.place(encoded)
        except Exception as error:
            self._fail_admission(encoding.jobs, error)
            return
        # the queue wait ends when the admission was chosen; the rows join the batch now
        self._admitted(encoding.jobs, encoded.rejected, self.engine.steps, encoding.admitted_at)

    def _fail_admission(self, newcomers: list[_Job], error: Exception) -> None:
        logger.exception("admitting %d sentences failed", len(newcomers), exc_info=error)
        self.metrics.engine_errors.inc()
        self._drop([job.job_id for job in newcomers])
        for job in newcomers:
            self._fail(
                job,
                EngineFailure(f"the engine failed to encode the input ({type(error).__name__})"),
            )

    def _admitted(
        self,
        newcomers: list[_Job],
        rejected: Sequence[RejectedRequest],
        admitted_step: int,
        now: float,
    ) -> None:
        refused = {rejection.request_id: rejection.reason for rejection in rejected}
        for job in newcomers:
            if job.job_id in refused:
                self._fail(
                    job, InvalidRow(f"the sentence cannot be decoded: {refused[job.job_id]}")
                )
                continue
            job.admitted_step = admitted_step
            job.queue_wait_s = now - job.enqueued_at
            self._running[job.job_id] = job
            self.metrics.queue_wait.observe(job.queue_wait_s)
            self.metrics.input_tokens.inc(job.src_len)
        self.metrics.admitted_rows.observe(
            sum(job.rows for job in newcomers if job.job_id not in refused)
        )

    def _step(self) -> None:
        rows_in_step = self.engine.active_rows
        calls_in_step = getattr(self.engine, "groups", 1)  # one decoder call per group
        try:
            finished = self.engine.step()
        except Exception as error:
            # The batch state is unknown now: fail every row in it and start afresh.
            logger.exception("engine.step failed with %d rows", rows_in_step)
            self.metrics.engine_errors.inc()
            failed = list(self._running.values())
            self._drop(list(self._running))
            for job in failed:
                self._fail(
                    job,
                    EngineFailure(f"the engine failed during decoding ({type(error).__name__})"),
                )
            return
        self.metrics.batch_rows.observe(rows_in_step)
        self.metrics.decode_steps.inc()
        self.metrics.decoder_calls.inc(calls_in_step)
        finished_step = self.engine.steps
        for done in finished:
            job = self._running.pop(done.request_id, None)
            if job is None:
                continue  # dropped meanwhile
            tokens = list(done.tokens)
            self.metrics.generated_tokens.inc(len(tokens))
            self.metrics.sentences.inc()
            result = RowResult(
                tokens, job.admitted_step, finished_step, job.queue_wait_s, list(done.hypotheses)
            )
            self._deliver(job, result, None)
        self.metrics.inflight_rows.set(self.engine.active_rows)
        if self.config.cost_aware and finished_step % 16 == 0:
            self.metrics.row_limit.set(self._knee_locked() or 0)

    def _drop(self, job_ids: list[int]) -> None:
        if not job_ids:
            return
        for job_id in job_ids:
            self._running.pop(job_id, None)
        try:
            self.engine.drop(job_ids)
        except Exception:
            logger.exception("engine.drop failed")
            self.metrics.engine_errors.inc()
        self.metrics.inflight_rows.set(self.engine.active_rows)

    def _fail(self, job: _Job, error: BaseException) -> None:
        self._deliver(job, None, error)

    @staticmethod
    def _deliver(job: _Job, result: RowResult | None, error: BaseException | None) -> None:
        def settle() -> None:
            if job.future.done():
                return  # the request was cancelled or timed out meanwhile
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)

        # A closed event loop raises RuntimeError: nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(settle)


class RowStream:
    """Results of one :meth:`ContinuousBatcher.submit_as_completed` call as rows finish.

    An async iterator with ``aclose()`` (use ``contextlib.aclosing``): closing it before the
    end abandons the unfinished rows, whether or not iteration ever started.
    """

    def __init__(
        self, batcher: ContinuousBatcher, jobs: list[_Job], timeout_s: float | None
    ) -> None:
        self._batcher = batcher
        self._jobs = jobs
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._index_of = {job.future: index for index, job in enumerate(jobs)}
        self._pending: set[asyncio.Future[RowResult]] = set(self._index_of)
        self._ready: deque[asyncio.Future[RowResult]] = deque()

    def __aiter__(self) -> RowStream:
        return self

    async def __anext__(self) -> tuple[int, RowResult]:
        try:
            while not self._ready:
                if not self._pending:
                    raise StopAsyncIteration
                wait_s = None if self._deadline is None else self._deadline - time.monotonic()
                if wait_s is not None and wait_s <= 0:
                    raise TimeoutError
                done, self._pending = await asyncio.wait(
                    self._pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                # Several may finish in one step (or while the consumer was busy): hand them
                # out in the order they finished.
                self._ready.extend(sorted(done, key=self._finish_order))
            future = self._ready.popleft()
            return self._index_of[future], future.result()
        except StopAsyncIteration:
            raise
        except BaseException:
            self.close()
            raise

    def _finish_order(self, future: asyncio.Future[RowResult]) -> tuple[int, int]:
        step = -1 if future.exception() is not None else future.result().finished_step
        return step, self._index_of[future]

    def close(self) -> None:
        """Abandon the rows that have not finished (no-op once all have)."""
        if self._pending:
            self._pending = set()
            self._batcher._abandon(self._jobs)

    async def aclose(self) -> None:
        self.close()
