"""CPU seconds per request by stage of the request path, one-process service on one core.

The service (``python -m service``, ``MT_PROCESS_MODE=single``) runs under ``taskset -c
--server-cpus`` with a CPU-time-weighted stack sampler inside it; this driver, pinned to
``--client-cpus``, drives it with ``--concurrency`` closed-loop clients sending held-out
interface strings (bench/heldout, one text a request). Each run has two windows:

1. **capacity**: the closed loop alone, no sampler: requests a second and the server's
   user + system CPU seconds per request (``/proc``);
2. **stages**: the same load with the sampler on, its thread pinned to ``--sampler-cpus``
   (off the server's core: from that core it would run only when the service's threads
   wait, and catch them at their waits). Every ``--interval-ms`` it reads each
   Python thread's CPU clock (``pthread_getcpuclockid``) and charges the CPU that thread has
   used since the previous sample to the stage its current stack is in (the rules in
   ``STAGE_RULES``). A thread that waits (epoll, a condition) uses no CPU and is charged
   nothing, so the shares are of CPU time, not of wall-clock time: on a machine shared
   with other work they still say where this process's CPU goes. The table divides each
   stage's CPU seconds by the requests answered in the window. That sampler can read a stack
   only where the thread lets the interpreter lock go, which biases it towards the calls that
   release it: the event loop's thread is split again by ``py-spy --gil`` from outside
   (``--loop-sampler``, bench/gil_sampler.py), and the engine thread is also timed around its
   calls (bench/engine_timers.py: ONNX Runtime against its own Python, by function).

``--code`` names checkouts to compare (``git worktree add /tmp/old COMMIT``); runs alternate
between them ``--pairs`` times, each with a fresh server, and the sampler runs from this file
against each checkout's ``service`` (``PYTHONPATH``), so both arms are measured the same way.

    .venv/bin/python -m bench.request_stages --code /tmp/old --code . --pairs 2
    .venv/bin/python -m bench.request_stages --offline   # the engine alone, same strings

The stages window also counts the served engine's encoder calls (``EncoderCalls``: admissions,
length classes, calls and their rows, padded against real source tokens, the fitted encoder
and step prices at the end) and reads /metrics for rows a step, decoder calls a step and the
engine thread's phases, so a change of the scheduler shows as the shapes it makes.

The sampler costs its own CPU (charged to ``profiler``), and the stages window runs with a
switch interval of a tenth of the sampling interval (so the sampler gets the GIL mid-burst,
not only when the event loop waits): the capacity window runs without either. Per-thread
CPU totals and the engine timers are exact; the split within a thread is a sample.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

# Stage rules: (priority, stage, path fragment, function names or None for any). The stage
# of a stack is the highest-priority rule any of its frames matches, the innermost frame
# breaking ties: logging called from the route is logging, pydantic called from the route is
# validation, the asyncio loop is charged only where nothing of the service is on the stack.
STAGE_RULES: tuple[tuple[int, str, str, frozenset[str] | None], ...] = (
    (4, "profiler", "request_stages.py", frozenset({"_run", "_walk", "stop", "watch"})),
    (3, "logging", "/logging/", None),
    (3, "logging", "service/web/request_log.py", None),
    (3, "metrics", "prometheus_client/", None),
    (3, "metrics", "service/metrics/", None),
    (2, "encoder", "service/runtime/engine.py", frozenset({"encode", "_encode_class", "place"})),
    (2, "encoder", "service/runtime/encoding.py", frozenset({"encode_group", "encode_calls"})),
    (2, "encoder", "service/runtime/groups.py", frozenset({"encode_group", "encode_calls"})),
    (2, "decoder steps", "service/runtime/engine.py", frozenset({"step"})),
    (2, "decoder steps", "service/runtime/groups.py", frozenset({"step", "advance"})),
    (2, "decoder steps", "service/runtime/stepping.py", frozenset({"advance_searches"})),
    (1, "engine (other)", "service/runtime/", None),
    (1, "engine (other)", "onnxruntime/", None),
    (2, "detection", "service/translation/detection.py", None),
    (2, "detection", "service/translation/word_lists.py", None),
    (2, "detection", "lingua", None),
    (2, "detection", "fasttext", None),
    (2, "splitting & protection", "service/text/segmenter.py", None),
    (2, "splitting & protection", "service/text/protection.py", None),
    (2, "splitting & protection", "service/text/unspellable.py", None),
    (2, "splitting & protection", "service/text/spans.py", None),
    (2, "splitting & protection", "service/text/placeholders.py", None),
    (2, "splitting & protection", "service/text/glossary.py", None),
    (2, "splitting & protection", "service/text/html.py", None),
    (2, "splitting & protection", "service/text/limits.py", None),
    (
        2,
        "detokenization",
        "service/text/tokenizer.py",
        frozenset(
            {"decode", "decode_batch", "detokenize", "_decode", "decode_many", "decode_pieces"}
        ),
    ),
    (1, "tokenization", "service/text/tokenizer.py", None),
    (1, "tokenization", "sentencepiece", None),
    (1, "JSON & validation", "/pydantic", None),
    (1, "JSON & validation", "/json/", None),
    (1, "JSON & validation", "fastapi/encoders.py", None),
    (1, "JSON & validation", "fastapi/_compat", None),
    (1, "JSON & validation", "starlette/responses.py", None),
    (1, "JSON & validation", "fastapi/dependencies/", None),
    (
        1,
        "JSON & validation",
        "fastapi/routing.py",
        frozenset({"serialize_response", "_prepare_response_content", "_extract_endpoint_context"}),
    ),
    (1, "JSON & validation", "service/web/schemas.py", None),
    (1, "HTTP (uvicorn, starlette, fastapi)", "uvicorn/", None),
    (1, "HTTP (uvicorn, starlette, fastapi)", "h11/", None),
    (1, "HTTP (uvicorn, starlette, fastapi)", "starlette/", None),
    (1, "HTTP (uvicorn, starlette, fastapi)", "fastapi/", None),
    (1, "HTTP (uvicorn, starlette, fastapi)", "anyio/", None),
    (1, "web: routes, middleware, admission", "service/web/", None),
    (1, "pipeline & translation glue", "service/text/", None),
    (1, "pipeline & translation glue", "service/translation/", None),
    (1, "queueing & scheduling", "service/scheduling/", None),
    (1, "queueing & scheduling", "service/engine_core/", None),
    (1, "service (other)", "/service/", None),
    (0, "event loop (asyncio, uvloop)", "/asyncio/", None),
    (0, "event loop (asyncio, uvloop)", "uvloop", None),
    (0, "threads & queues", "/threading.py", None),
    (0, "threads & queues", "/queue.py", None),
    (0, "threads & queues", "concurrent/futures", None),
)
OTHER = "other"
LOOP_C = "event loop C (uvloop: epoll, sockets, HTTP parser)"
LOOP_CODES: set[CodeType] = set()


def _loop_codes() -> set[CodeType]:
    """The code objects of the frames under which uvloop runs its C loop."""
    import asyncio.base_events
    import asyncio.runners

    codes = {
        asyncio.runners.Runner.run.__code__,
        asyncio.base_events.BaseEventLoop.run_forever.__code__,
    }
    codes.add(asyncio.base_events.BaseEventLoop.run_until_complete.__code__)
    return codes


# The same runners as py-spy names them (``Runner.run``)
LOOP_RUNNERS = frozenset(code.co_qualname for code in _loop_codes())


STAGE_ORDER = (
    LOOP_C,
    "HTTP (uvicorn, starlette, fastapi)",
    "JSON & validation",
    "web: routes, middleware, admission",
    "logging",
    "metrics",
    "detection",
    "splitting & protection",
    "tokenization",
    "pipeline & translation glue",
    "queueing & scheduling",
    "event loop (asyncio, uvloop)",
    "threads & queues",
    "encoder",
    "decoder steps",
    "engine (other)",
    "detokenization",
    "service (other)",
    OTHER,
    "profiler",
)


def _rule_of(code: CodeType) -> tuple[int, str] | None:
    return _rule_of_name(code.co_filename.replace("\\", "/"), code.co_name)


def _rule_of_name(path: str, name: str) -> tuple[int, str] | None:
    for priority, stage, fragment, names in STAGE_RULES:
        if fragment in path and (names is None or name in names):
            return priority, stage
    return None


def _stage(rules: Iterable[tuple[int, str] | None], in_loop_runner: bool) -> str:
    """The stage of a stack from its frames' rules, innermost first (the highest priority
    wins, the innermost frame breaking ties); ``in_loop_runner``: the innermost Python frame
    is the loop runner itself, so uvloop's C code runs (epoll, socket reads and writes, the
    HTTP parser, callbacks' scheduling)."""
    if in_loop_runner:
        return LOOP_C
    best: tuple[int, str] | None = None
    for rule in rules:
        if rule is not None and (best is None or rule[0] > best[0]):
            best = rule
    return best[1] if best else OTHER


def stage_of_frames(frames: list[tuple[str, str]]) -> str:
    """The stage of a py-spy stack, (function, short path) outermost first, by the rules of
    ``StageSampler._walk`` (py-spy names functions ``Class.method`` and cuts paths at
    site-packages)."""
    return _stage(
        (
            _rule_of_name(f"/{path}", function.rsplit(".", 1)[-1])
            for function, path in reversed(frames)
        ),
        bool(frames) and frames[-1][0] in LOOP_RUNNERS,
    )


class StageSampler:
    """Charges each Python thread's CPU time to the stage of the stack it is in."""

    def __init__(self, interval_s: float, cpus: set[int] | None = None) -> None:
        self.interval_s = interval_s
        self.cpus = cpus
        self.rules: dict[CodeType, tuple[int, str] | None] = {}
        self.by_stage: dict[str, float] = defaultdict(float)
        self.by_thread: dict[str, float] = defaultdict(float)
        self.by_thread_stage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.by_function: dict[tuple[str, CodeType], float] = defaultdict(float)
        self.by_stack: dict[tuple[CodeType, ...], float] = defaultdict(float)
        self.inclusive: dict[CodeType, float] = defaultdict(float)
        self.samples = 0
        self._clocks: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-sampler", daemon=True)

    def start(self) -> None:
        self.started = time.perf_counter()
        self.process_cpu_before = _process_cpu()
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {
            "window_s": time.perf_counter() - self.started,
            "process_cpu_s": _process_cpu() - self.process_cpu_before,
            "sampled_cpu_s": sum(self.by_stage.values()),
            "samples": self.samples,
            "by_stage": dict(self.by_stage),
            "by_thread": dict(self.by_thread),
            "by_thread_stage": {k: dict(v) for k, v in self.by_thread_stage.items()},
            "top_functions": {
                f"{stage} | {_where(code)}": spent
                for (stage, code), spent in sorted(
                    self.by_function.items(), key=lambda item: -item[1]
                )[:150]
            },
            "inclusive": dict(
                sorted(
                    ((_where(code), spent) for code, spent in self.inclusive.items()),
                    key=lambda item: -item[1],
                )[:250]
            ),
            "top_stacks": {
                " < ".join(map(_where, codes)): spent
                for codes, spent in sorted(self.by_stack.items(), key=lambda item: -item[1])[:100]
            },
        }

    def _walk(self, frame: FrameType | None) -> tuple[str, list[CodeType]]:
        """The stage of the stack and its code objects, innermost first."""
        codes: list[CodeType] = []
        rules: list[tuple[int, str] | None] = []
        while frame is not None:
            code = frame.f_code
            codes.append(code)
            try:
                rules.append(self.rules[code])
            except KeyError:
                rules.append(self.rules.setdefault(code, _rule_of(code)))
            frame = frame.f_back
        return _stage(rules, bool(codes) and codes[0] in LOOP_CODES), codes

    def _run(self) -> None:
        if self.cpus:
            # Off the server's core: sampling from that core would run only when the others
            # leave it, that is when they wait, and catch them at their waits.
            os.sched_setaffinity(0, self.cpus)
        names = {}
        while not self._stop.wait(self.interval_s):
            self.samples += 1
            frames = sys._current_frames()
            for ident, frame in frames.items():
                clock = self._clocks.get(ident)
                if clock is None:
                    try:
                        clock_id = time.pthread_getcpuclockid(ident)
                    except (OSError, ValueError):
                        continue
                    clock = self._clocks[ident] = (clock_id, time.clock_gettime(clock_id))
                    continue
                clock_id, previous = clock
                try:
                    now = time.clock_gettime(clock_id)
                except OSError:
                    continue
                self._clocks[ident] = (clock_id, now)
                spent = now - previous
                if spent <= 0:
                    continue
                stage, codes = self._walk(frame)
                self.by_function[(stage, codes[0])] += spent
                self.by_stack[tuple(codes[:14])] += spent
                for code in set(codes):
                    self.inclusive[code] += spent
                if ident not in names:
                    names[ident] = _thread_name(ident)
                self.by_stage[stage] += spent
                self.by_thread[names[ident]] += spent
                self.by_thread_stage[names[ident]][stage] += spent
            del frames


def _where(code: CodeType) -> str:
    return f"{code.co_filename.rsplit('site-packages/', 1)[-1].rsplit('/lib/python3', 1)[-1]}:{code.co_name}"


def _thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return "event loop" if thread is threading.main_thread() else thread.name
    return str(ident)


def _process_cpu() -> float:
    times = os.times()
    return times.user + times.system


class EncoderCalls:
    """Counts the served engine's encoder calls over the stages window (rows, padded and
    real source tokens), by wrapping ``service.runtime.encoding.encode_group``: how large
    the calls are that the scheduler's admissions make."""

    def __init__(self) -> None:
        self.calls = 0
        self.rows = 0
        self.padded_tokens = 0
        self.tokens = 0
        self.by_rows: dict[int, int] = defaultdict(int)
        self.admissions = 0  # ``Engine.encode`` calls: one an admission
        self.classes = 0  # length classes those admissions were cut into
        self.admitted_rows: dict[int, int] = defaultdict(int)
        self._original: Any = None
        self._originals: dict[str, Any] = {}

    def patch(self) -> None:
        from service.runtime import encoding

        original = self._original = encoding.encode_group

        def counted(kv: Any, info: Any, requests: list[Any]) -> Any:
            lengths = [len(request.src_ids) for request in requests]
            self.calls += 1
            self.rows += len(lengths)
            self.padded_tokens += len(lengths) * max(lengths)
            self.tokens += sum(lengths)
            self.by_rows[len(lengths)] += 1
            return original(kv, info, requests)

        encoding.encode_group = counted
        from service.runtime import engine

        encode_class = self._originals["encode_class"] = encoding.encode_class
        encode_requests = self._originals["encode_requests"] = engine.encode_requests

        def counted_class(*args: Any) -> Any:
            self.classes += 1
            return encode_class(*args)

        def counted_requests(kv: Any, info: Any, requests: list[Any], *args: Any) -> Any:
            self.admissions += 1
            self.admitted_rows[len(requests)] += 1
            return encode_requests(kv, info, requests, *args)

        encoding.encode_class = counted_class  # type: ignore[assignment]
        engine.encode_requests = counted_requests  # type: ignore[assignment]

    def unpatch(self) -> dict[str, Any]:
        import gc

        from service.runtime import encoding, engine

        engines = [o for o in gc.get_objects() if isinstance(o, engine.Engine)]
        prices = {
            "encode": [e.encode_cost.coefficients for e in engines],
            "encode_cpu": [getattr(e.encode_cost, "cpu_coefficients", None) for e in engines],
            "step": [e.step_cost.coefficients for e in engines],
        }
        encoding.encode_group = self._original
        encoding.encode_class = self._originals["encode_class"]
        engine.encode_requests = self._originals["encode_requests"]
        return {
            "prices": prices,
            "admissions": self.admissions,
            "classes": self.classes,
            "admitted_rows": dict(sorted(self.admitted_rows.items())),
            "calls": self.calls,
            "rows": self.rows,
            "padded_tokens": self.padded_tokens,
            "tokens": self.tokens,
            "by_rows": dict(sorted(self.by_rows.items())),
        }


def _engine_timers() -> Any:
    """bench/engine_timers.py's ``EngineTimers``, loaded from beside this file: the server's
    ``bench`` package is the measured checkout's, which may predate it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "engine_timers", Path(__file__).with_name("engine_timers.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EngineTimers()


def serve(control: Path, interval_s: float, cpus: set[int]) -> None:
    """Run ``python -m service`` with a sampler that starts when ``control/start`` appears
    and writes ``control/profile.json`` when ``control/stop`` does."""
    import runpy

    def watch() -> None:
        while not (control / "start").exists():
            time.sleep(0.05)
        LOOP_CODES.update(_loop_codes())
        sampler = StageSampler(interval_s, cpus)
        counter = EncoderCalls()
        calls: EncoderCalls | None = counter
        try:
            counter.patch()
        except (ImportError, AttributeError):  # a checkout from before these functions
            calls = None
        timers = _engine_timers()
        timers.patch()
        timers.start()
        # The sampler needs the GIL to read stacks, and a thread holding it lets go after
        # the switch interval (5 ms) or when it waits: most of a request's bursts are shorter,
        # so at 5 ms the sampler would mostly catch the event loop at its wait.
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, interval_s / 10))
        sampler.start()
        while not (control / "stop").exists():
            time.sleep(0.2)
        result = sampler.stop()
        result["encoder_calls"] = calls.unpatch() if calls is not None else None
        result["engine_timers"] = timers.stop()
        sys.setswitchinterval(switch_interval)
        import service

        result["service_package"] = str(Path(service.__file__).parent)
        (control / "profile.json.part").write_text(json.dumps(result))
        (control / "profile.json.part").rename(control / "profile.json")

    threading.Thread(target=watch, name="stage-control", daemon=True).start()
    sys.argv = ["service", *sys.argv[1:]]
    runpy.run_module("service", run_name="__main__", alter_sys=True)


# --- the driver ------------------------------------------------------------------------------

HELDOUT = Path(__file__).resolve().parent / "heldout" / "ui_strings_en_de.json"


class HeldoutSampler:
    """One held-out English interface string a request, in a seeded shuffled order (the
    interface ``loadtest`` generators take from ``InputSampler``)."""

    def __init__(self, seed: int, kind: str = "short") -> None:
        import random

        data = json.loads(HELDOUT.read_text())
        self.texts = sorted(
            text for project in data["strings"].values() for text in project["en"][kind]
        )
        self.kind = kind
        self.seed = seed
        random.Random(seed).shuffle(self.texts)
        self._next = 0

    def next_text(self) -> str:
        text = self.texts[self._next % len(self.texts)]
        self._next += 1
        return text

    def next_payload(self) -> dict[str, Any]:
        return {"text": self.next_text(), "source_lang": "en", "target_lang": "de"}

    def describe(self) -> dict[str, Any]:
        return {"heldout": str(HELDOUT.name), "kind": self.kind, "seed": self.seed}


def closed_loop(url: str, concurrency: int, seconds: float, seed: int) -> dict[str, Any]:
    """``concurrency`` closed-loop clients sending held-out strings (``HeldoutSampler(seed)``)
    to ``url`` for ``seconds``: the run's summary (``loadtest.closed_loop``)."""
    from loadtest.client import run_async
    from loadtest.closed_loop import measure_closed_loop

    _, summary = run_async(
        measure_closed_loop(
            url,
            HeldoutSampler(seed),  # type: ignore[arg-type]
            concurrency=concurrency,
            duration_s=seconds,
            max_requests=None,
            timeout_s=60.0,
        )
    )
    return summary


def one_run(args: Any, code: Path, label: str, seed: int) -> dict[str, Any]:
    import shutil
    import tempfile

    from bench.gil_sampler import GilSampler
    from loadtest.client import spawned_process
    from loadtest.cpu_accounting import process_cpu_seconds

    control = Path(tempfile.mkdtemp(prefix="stages-"))
    command = [
        "taskset", "-c", args.server_cpus, sys.executable, str(Path(__file__).resolve()),
        "serve", str(control), str(args.interval_ms / 1000), args.sampler_cpus,
        "--host", "127.0.0.1", "--port", "{port}",
    ]  # fmt: skip
    env = {
        "PYTHONPATH": str(code.resolve()),
        "MT_PROCESS_MODE": "single",
        **dict(pair.split("=", 1) for pair in args.server_env),
    }
    log_path = control / "server.log"
    try:
        with spawned_process(
            args.model, command=command, extra_env=env, log_path=log_path, cwd=code
        ) as (url, process):

            def closed(seconds: float, seed: int) -> dict[str, Any]:
                return closed_loop(url, args.concurrency, seconds, seed)

            closed(args.warmup, seed + 1000)
            cpu_before = process_cpu_seconds(process.pid) or 0.0
            started = time.perf_counter()
            capacity = closed(args.duration, seed)
            window = time.perf_counter() - started
            cpu_s = (process_cpu_seconds(process.pid) or 0.0) - cpu_before
            (control / "start").touch()
            loop_sampler = (
                GilSampler(process.pid, args.duration, args.sampler_cpus).start()
                if args.loop_sampler == "py-spy"
                else None
            )
            staged = closed(args.duration, seed + 1)
            (control / "stop").touch()
            deadline = time.monotonic() + 30
            while not (control / "profile.json").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            profile = json.loads((control / "profile.json").read_text())
            if loop_sampler is not None:
                split_event_loop_again(profile, loop_sampler.wait())
            profile["batches"] = batch_means(url)
    except Exception:
        if log_path.exists():
            print(log_path.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        shutil.rmtree(control, ignore_errors=True)
    return {
        "label": label,
        "code": str(code),
        "service_package": profile.pop("service_package", None),
        "capacity": {
            "rps": capacity["throughput_rps"],
            "ok": capacity["ok"],
            "failed": capacity["failed"],
            "p50_ms": capacity["latency_ms"]["p50"],
            "p99_ms": capacity["latency_ms"]["p99"],
            "cpu_s_per_request": cpu_s / capacity["ok"] if capacity["ok"] else None,
            "cores_busy": cpu_s / window,
        },
        "stages": {"requests": staged["ok"], "rps": staged["throughput_rps"], **profile},
    }


def split_event_loop_again(
    profile: dict[str, Any], stacks: list[tuple[str, list[tuple[str, str]], int]]
) -> None:
    """The event loop thread's CPU (the in-process total) split by py-spy's ``--gil`` shares
    (bench/gil_sampler.py says why); the in-process split stays as ``by_stage_in_process``."""
    from bench.gil_sampler import stage_shares

    shares = stage_shares(stacks, "MainThread", stage_of_frames)
    if not shares:
        return
    loop_cpu = profile["by_thread"].get("event loop", 0.0)
    by_stage = defaultdict(float, profile["by_stage"])
    for stage, spent in profile["by_thread_stage"].get("event loop", {}).items():
        by_stage[stage] -= spent
    for stage, share in shares.items():
        by_stage[stage] += share * loop_cpu
    profile["by_stage_in_process"] = profile["by_stage"]
    profile["by_stage"] = {stage: spent for stage, spent in by_stage.items() if spent > 1e-9}
    profile["by_thread_stage"]["event loop"] = {s: v * loop_cpu for s, v in shares.items()}
    profile["event_loop_split"] = {
        "sampler": "py-spy --gil",
        "samples": sum(count for thread, _, count in stacks if thread == "MainThread"),
    }


def batch_means(url: str) -> dict[str, float | None]:
    """Mean rows per decoder step and per admission over the server's life (/metrics)."""
    import re

    import httpx

    text = httpx.get(url + "/metrics", timeout=10.0).text
    sums: dict[str, float] = defaultdict(float)
    for name, value in re.findall(
        r"^(mt_batch_(?:admitted_)?rows_(?:sum|count))\{?[^ ]*\}? (\S+)$", text, re.M
    ):
        sums[name] += float(value)
    means: dict[str, float | None] = {
        kind: sums[f"mt_batch_{kind}_sum"] / sums[f"mt_batch_{kind}_count"]
        if sums[f"mt_batch_{kind}_count"]
        else None
        for kind in ("rows", "admitted_rows")
    }
    counts = {
        name: sum(
            float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        )
        for name in ("mt_decode_steps_total", "mt_decoder_calls_total")
    }
    steps = counts["mt_decode_steps_total"]
    means["decoder_calls_per_step"] = counts["mt_decoder_calls_total"] / steps if steps else None
    means["steps"] = steps
    for phase, value in re.findall(
        r'^mt_engine_phase_seconds_total{[^}]*phase="([^"]+)"[^}]*} (\S+)$', text, re.M
    ):
        means[f"phase_{phase}_s"] = (means.get(f"phase_{phase}_s") or 0.0) + float(value)
    return means


def stage_table(runs: list[dict[str, Any]], labels: list[str]) -> str:
    """Markdown: CPU ms per request by stage, the median over each label's runs."""
    import statistics

    def per_request(run: dict[str, Any], stage: str) -> float:
        stages = run["stages"]
        return 1000 * stages["by_stage"].get(stage, 0.0) / max(stages["requests"], 1)

    stages = [s for s in STAGE_ORDER if any(s in r["stages"]["by_stage"] for r in runs)]
    header = "| stage | " + " | ".join(f"{label} ms/req" for label in labels)
    lines = [header + " |", "|---|" + "---|" * len(labels)]
    for stage in [*stages, "total sampled"]:
        cells = []
        for label in labels:
            mine = [r for r in runs if r["label"] == label]
            if stage == "total sampled":
                values = [sum(per_request(r, s) for s in stages) for r in mine]
            else:
                values = [per_request(r, stage) for r in mine]
            cells.append(f"{statistics.median(values):.3f}" if values else "")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    for thread_label in ("event loop",):
        cells = []
        for label in labels:
            mine = [r for r in runs if r["label"] == label]
            values = [
                1000
                * r["stages"]["by_thread"].get(thread_label, 0.0)
                / max(r["stages"]["requests"], 1)
                for r in mine
            ]
            cells.append(f"{statistics.median(values):.3f}" if values else "")
        lines.append(f"| (thread: {thread_label}) | " + " | ".join(cells) + " |")
    cells = []
    for label in labels:
        mine = [r for r in runs if r["label"] == label]
        others = [
            1000
            * sum(v for k, v in r["stages"]["by_thread"].items() if k != "event loop")
            / max(r["stages"]["requests"], 1)
            for r in mine
        ]
        cells.append(f"{statistics.median(others):.3f}" if others else "")
    lines.append("| (threads: all others) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def capacity_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| run | arm | req/s | CPU ms/req | p50 ms | p99 ms | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, run in enumerate(runs):
        c = run["capacity"]
        cpu = c["cpu_s_per_request"]
        lines.append(
            f"| {index} | {run['label']} | {c['rps']:.1f} | "
            f"{1000 * cpu:.2f} | {c['p50_ms']} | {c['p99_ms']} | {c['failed']} |"
            if cpu is not None
            else f"| {index} | {run['label']} | {c['rps']:.1f} | – | – | – | {c['failed']} |"
        )
    return "\n".join(lines)


def offline(args: Any) -> dict[str, Any]:
    """The engine alone on the same strings, on ``--server-cpus``: length-sorted batches of
    ``--offline-batch``, one ONNX Runtime thread, greedy, the text pipeline around it (what
    the served capacity is compared with)."""
    from loadtest.client import REPO_ROOT, cpu_list
    from service.runtime.engine import Engine
    from service.text.limits import DecodingOptions, TextLimits
    from service.text.pipeline import TextPipeline
    from service.text.plans import SentencePlan
    from service.text.tokenizer import Tokenizer

    os.sched_setaffinity(0, cpu_list(args.server_cpus))
    model_dir = Path(REPO_ROOT, args.model)
    engine = Engine.from_dir(model_dir, intra_op_threads=1)
    engine.warmup()
    pipeline = TextPipeline(Tokenizer.from_dir(model_dir), TextLimits(), "en")
    options = DecodingOptions(beam_size=1, max_new_tokens=None, length_penalty=1.0)

    def decode_rows(sentences: list[SentencePlan], _: DecodingOptions) -> list[list[int]]:
        return engine.translate_ids(
            [list(s.src_ids) for s in sentences],
            beam_size=1,
            max_new_tokens=max(s.max_new_tokens for s in sentences),
            copy_tokens=[s.copy_tokens for s in sentences],
        )

    texts = sorted(HeldoutSampler(0).texts[: args.offline_texts], key=len)
    batches = [texts[i : i + args.offline_batch] for i in range(0, len(texts), args.offline_batch)]
    started, cpu_started, sentences = time.perf_counter(), time.process_time(), 0
    for batch in batches:
        sentences += pipeline.translate(batch, options, decode_rows).decoded_sentences
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "texts": len(texts),
        "sentences": sentences,
        "batch": args.offline_batch,
        "sentences_per_s": sentences / wall,
        "cpu_ms_per_sentence": 1000 * cpu / sentences,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        sys.argv = [sys.argv[0], *argv[4:]]
        serve(Path(argv[1]), float(argv[2]), {int(cpu) for cpu in argv[3].split(",")})
        return 0
    from bench.gil_sampler import py_spy

    parser = argparse.ArgumentParser(prog="python -m bench.request_stages", description=__doc__)
    parser.add_argument("--code", action="append", type=Path, help="checkout(s) to compare")
    parser.add_argument("--model", default="build/onnx/default")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument(
        "--sampler-cpus", default="1", help="where the sampler thread runs (not the server's)"
    )
    parser.add_argument(
        "--loop-sampler",
        choices=("py-spy", "in-process"),
        default="py-spy" if py_spy() else "in-process",
        help="what splits the event loop thread's CPU (bench/gil_sampler.py: why py-spy)",
    )
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("bench/results/request_stages.json"))
    parser.add_argument(
        "--offline", action="store_true", help="the engine alone on the same strings, then stop"
    )
    parser.add_argument("--offline-batch", type=int, default=32)
    parser.add_argument("--offline-texts", type=int, default=2048)
    args = parser.parse_args(argv)
    if args.offline:
        print(json.dumps(offline(args)))
        return 0
    from bench.engine_timers import summary
    from loadtest.client import cpu_list
    from loadtest.machine import machine_facts

    os.sched_setaffinity(0, cpu_list(args.client_cpus))
    codes = args.code or [Path(".")]
    labels = [f"{index}:{code}" for index, code in enumerate(codes)]
    runs = []
    for pair in range(args.pairs):
        for code, label in zip(codes, labels, strict=True):
            print(f"pair {pair}: {label}", flush=True)
            run = one_run(args, code, label, seed=pair)
            c = run["capacity"]
            print(f"  batches {run['stages'].get('batches')}", flush=True)
            calls = run["stages"].get("encoder_calls") or {}
            if calls.get("calls"):
                print(
                    f"  encoder calls {calls['calls']}: {calls['rows'] / calls['calls']:.1f} rows,"
                    f" padded/real tokens {calls['padded_tokens'] / max(calls['tokens'], 1):.2f},"
                    f" calls a request {calls['calls'] / max(run['stages']['requests'], 1):.3f};"
                    f" admissions {calls['admissions']}, length classes {calls['classes']}",
                    flush=True,
                )
            if run["stages"].get("engine_timers"):
                print(f"  {summary(run['stages']['engine_timers'], run['stages']['requests'])}")
            print(
                f"  {c['rps']:.1f} req/s, {1000 * (c['cpu_s_per_request'] or 0):.2f} ms CPU/req,"
                f" p50 {c['p50_ms']} p99 {c['p99_ms']} ms ({run['service_package']})",
                flush=True,
            )
            runs.append(run)
    report = capacity_table(runs) + "\n\n" + stage_table(runs, labels)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": machine_facts(),
                "config": {k: str(v) for k, v in vars(args).items()},
                "runs": runs,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
