"""Deterministic replay of what the continuous batcher does to the engine at low load.

    .venv/bin/python bench/engine_admission_bench.py [--model /tmp/interim_onnx] [--ref HEAD]
        [--every 4] [--reps 5] [--beams 1,4] [--threads 1] [--output FILE]
    taskset -c 0 .venv/bin/python bench/engine_admission_bench.py --model build/onnx/default \
        --load 140 --duration 20 --seed 2 [--mix ui=0.8,help=0.2] [--loop-work-ms 1.5]

``--load`` replays ``loadtest``'s own arrivals and texts for that seed and mix (what
``loadtest compare --seed 2 --mix ...`` sends the service) into a real batcher and engine in
this process, without HTTP; ``--loop-work-ms`` stands in for the event loop's share of a
request. The rest of this docstring is the default, low-load replay.

Scenario ("mixed"): one long request (a paragraph, capped at ``--long-tokens`` output tokens)
starts decoding; a short request (a UI string, ~4-8 tokens out) joins every ``--every`` steps
while the long one runs. Exactly the batcher's engine-thread loop: ``add`` before a step,
``step``, collect finished. Baseline ("alone"): every request of the replay run alone
(add, step until done) on the same engine.

Reported per variant (times in ms, medians over ``--reps`` replays): per-step wall time, time
in ``add`` (and the encoder inside it), in the decoder graph, in cache select/trim/concat
(``OnnxSeq2Seq.select`` / ``concat`` and anything else the engine reports through
``Engine.timings``), the rest of ``step`` (host overhead); per-request latency (from its
``add`` to the step that finished it) mixed vs alone.

``--ref`` loads ``service/runtime/engine.py`` and ``service/runtime/onnx_model.py`` of a git revision into a
private package and replays them interleaved with the working tree's (A/B in one process, so
a background load affects both alike); ratios are new / ref. Tokens must be identical.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --load: requests with longer texts are counted as paragraphs (help texts), the rest as
# UI strings, for the latency split.
LONG_TEXT_CHARS = 100
sys.path.insert(0, str(ROOT))

from loadtest.inputs import parse_weights  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402
from service.runtime.groups import Group  # noqa: E402
from service.runtime.types import DecodeRequest  # noqa: E402
from service.text.tokenizer import Tokenizer  # noqa: E402

LONG_TEXT = (
    "To change your password, open the settings of your account, enter the old password, then "
    "the new password twice, and confirm with the button at the bottom of the page."
)
SHORT_TEXTS = [
    "Save",
    "Close",
    "Copy",
    "Paste",
    "Undo",
    "Exit",
    "Login",
    "Help",
    "Print",
    "Search",
    "Settings",
    "Delete file",
    "Open folder",
]


def load_ref(revision: str) -> type:
    """``Engine`` of ``revision`` (its engine.py + onnx_model.py; decoding.py of the tree)."""
    package = Path(tempfile.mkdtemp(prefix="engine_ref_")) / "_ref_service"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("engine.py", "onnx_model.py"):
        source = subprocess.run(
            ["git", "show", f"{revision}:service/{name}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        source = source.replace("from service.onnx_model", "from _ref_service.onnx_model")
        (package / name).write_text(source)
    sys.path.insert(0, str(package.parent))
    return importlib.import_module("_ref_service.engine").Engine


class Timers:
    """Wraps methods of an object with wall-clock accumulators (seconds per key)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: object, name: str, key: str) -> None:
        method = getattr(owner, name, None)
        if method is None:
            return

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.total[key] += time.perf_counter() - started
                self.calls[key] += 1

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.total.clear()
        self.calls.clear()


def instrument(engine: Engine) -> Timers:
    timers = Timers()
    # This tree's engine calls its KV backend; revisions before the backends (``--ref``) call
    # the model object itself, with ``concat`` where the backends have ``merge``.
    backend = getattr(engine.model, "kv", engine.model)
    timers.wrap(backend, "encode", "encode")
    timers.wrap(backend, "decode", "decode")
    for name in ("select", "merge", "concat"):
        timers.wrap(backend, name, "kv_select" if name == "select" else "kv_merge")
    timers.wrap(Group, "rearrange", "rearrange")
    return timers


def replay(engine: Engine, timers: Timers, schedule: dict[int, list[DecodeRequest]]) -> dict:
    """The batcher's loop over ``schedule`` (step -> requests added before it)."""
    timers.reset()
    added_at: dict = {}
    latency: dict = {}
    tokens: dict = {}
    step_times: list[float] = []
    add_total = 0.0
    step = 0
    while step <= max(schedule) or engine.active_requests:
        requests = schedule.get(step, [])
        if requests:
            started = time.perf_counter()
            for request in requests:
                added_at[request.request_id] = started
            engine.add(requests)
            add_total += time.perf_counter() - started
        started = time.perf_counter()
        finished = engine.step()
        now = time.perf_counter()
        step_times.append(now - started)
        for done in finished:
            latency[done.request_id] = now - added_at[done.request_id]
            tokens[done.request_id] = done.tokens
        step += 1
    step_total = sum(step_times)
    kv = sum(timers.total[key] for key in ("kv_select", "kv_merge"))
    return {
        "steps": len(step_times),
        "wall_s": step_total + add_total,
        "step_total_s": step_total,
        "add_total_s": add_total,
        "encode_s": timers.total["encode"],
        "decode_s": timers.total["decode"],
        "kv_select_s": timers.total["kv_select"],
        "kv_merge_s": timers.total["kv_merge"],
        "rearrange_s": timers.total["rearrange"],  # includes kv_select called from it
        # add minus the encoder: padding, concatenation of the running batch
        "add_host_s": add_total - timers.total["encode"] - timers.total["kv_merge"],
        # step minus the decoder graph and the rearrange (search, masks, inputs)
        "step_host_s": step_total - timers.total["decode"] - timers.total["rearrange"],
        "kv_total_s": kv,
        "latency_s": latency,
        "tokens": tokens,
    }


def make_schedules(
    tokenizer, beam: int, every: int, long_tokens: int, short_count: int
) -> tuple[dict, list[DecodeRequest]]:
    long_request = DecodeRequest("long", tokenizer.encode_one(LONG_TEXT), beam, long_tokens)
    shorts = [
        DecodeRequest(
            f"short{i}", tokenizer.encode_one(SHORT_TEXTS[i % len(SHORT_TEXTS)]), beam, 16
        )
        for i in range(short_count)
    ]
    schedule: dict[int, list[DecodeRequest]] = {0: [long_request]}
    for i, request in enumerate(shorts):
        schedule[1 + i * every] = [request]
    return schedule, [long_request, *shorts]


def summarize(runs: list[dict], ids: list) -> dict:
    med = lambda key: statistics.median(run[key] for run in runs)  # noqa: E731
    out = {
        key: round(med(key) * 1000, 3)
        for key in (
            "wall_s",
            "step_total_s",
            "add_total_s",
            "encode_s",
            "decode_s",
            "kv_select_s",
            "kv_merge_s",
            "rearrange_s",
            "add_host_s",
            "step_host_s",
        )
    }
    out = {key.removesuffix("_s") + "_ms": value for key, value in out.items()}
    steps = runs[0]["steps"]
    out["steps"] = steps
    out["per_step_ms"] = round(out["step_total_ms"] / steps, 4)
    out["latency_ms"] = {
        str(i): round(statistics.median(run["latency_s"][i] for run in runs) * 1000, 3) for i in ids
    }
    return out


# --- high-arrival replay: the real batcher + translator in one process, no HTTP ---------------


async def _load_run(
    model: str,
    policy: str,
    rate: float,
    duration: float,
    seed: int,
    threads: int,
    mix: dict[str, float],
    profile: bool = False,
    loop_work_s: float = 0.0,
) -> dict:
    """Open-loop Poisson arrivals (``loadtest``'s schedule and inputs) into a real
    ``ContinuousBatcher`` over a real ``Engine`` in this process, built as the service builds
    them (calibrated step cost, the settings' batching group); per-request latency from
    the scheduled arrival.
    Reported beside latency: rows and decoder calls per step, the share of wall time spent
    in ``engine.step`` (the rest: admissions, i.e. encoder calls and cache merges, and
    waiting), mean queue wait, and time per engine operation."""
    import asyncio

    from loadtest.inputs import InputSampler
    from loadtest.open_loop import poisson_schedule
    from service.config import Settings
    from service.scheduling.batcher import ContinuousBatcher
    from service.text.tokenizer import Tokenizer
    from service.translation.translator import Translator
    from service.wiring import spare_core

    settings = Settings(exports=[Path(model)], batching=policy)
    engine = Engine.from_dir(model, provider="cpu", intra_op_threads=threads)
    engine.warmup()
    # As the service builds it (service/wiring.py): calibrate the step cost, then the
    # batcher from the settings.
    if settings.scheduling.admission_cost_aware and policy == "continuous":
        engine.calibrate()
    timers = instrument(engine)
    batcher = ContinuousBatcher(engine, settings.scheduling, spare_core=spare_core())
    translator = Translator(
        Tokenizer.from_dir(model),
        batcher,
        settings.limits,
        model_positions=engine.model.info.max_positions,
    )
    if profile:  # the engine thread, where the work is
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        inner_run = batcher._loop.run

        def profiled_run() -> None:
            profiler.enable()
            try:
                inner_run()
            finally:
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(30)

        batcher._loop.run = profiled_run  # type: ignore[method-assign]
    # loadtest's own schedule and inputs for this seed and mix: what `loadtest compare --seed`
    # sends the service, replayed here without HTTP
    sampler = InputSampler(seed=seed, weights=mix)
    schedule = poisson_schedule(rate, duration_s=duration, seed=seed)
    arrivals = [(at, sampler.next_payload()["text"]) for at in schedule]
    options = translator.limits.options(None, None)
    latencies: list[float] = []
    by_kind: dict[str, list[float]] = {"short": [], "long": []}  # UI strings, paragraphs
    failures = 0
    batcher.start()
    start = time.perf_counter()

    async def one(at: float, text: str) -> None:
        nonlocal failures
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        try:
            _hold_the_loop(loop_work_s)  # what HTTP, detection and JSON cost the event loop
            await translator.translate([text], options)
            latencies.append(time.perf_counter() - start - at)
            by_kind["long" if len(text) > LONG_TEXT_CHARS else "short"].append(latencies[-1])
        except Exception:  # noqa: BLE001 - counted
            failures += 1

    steps0 = engine.steps
    rows_total = slots_total = calls_total = 0
    busy_s = 0.0
    inner_step = engine.step
    timers.reset()

    def counted_step():
        nonlocal rows_total, slots_total, calls_total, busy_s
        shapes = engine.step_shapes
        rows_total += engine.active_rows
        slots_total += sum(shape.rows * shape.past_len for shape in shapes)
        calls_total += len(shapes)
        started = time.perf_counter()
        try:
            return inner_step()
        finally:
            busy_s += time.perf_counter() - started

    engine.step = counted_step
    waits: list[float] = []
    inner_admitted = batcher._loop.joins._admitted

    def counted_admitted(newcomers, rejected, admitted_step, admitted_at):
        inner_admitted(newcomers, rejected, admitted_step, admitted_at)
        waits.extend(sentence.queue_wait_s for sentence in newcomers)

    batcher._loop.joins._admitted = counted_admitted  # type: ignore[method-assign]
    await asyncio.gather(*(one(at, text) for at, text in arrivals))
    wall = time.perf_counter() - start
    steps = engine.steps - steps0
    batcher.close()
    return {
        "policy": policy,
        "requests": len(arrivals),
        "failures": failures,
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(latencies) / wall, 2),
        "p50_ms": _percentile_ms(latencies, 0.5),
        "p90_ms": _percentile_ms(latencies, 0.9),
        "p99_ms": _percentile_ms(latencies, 0.99),
        **{
            f"{kind}_p{q}_ms": _percentile_ms(values, q / 100)
            for kind, values in by_kind.items()
            for q in (50, 99)
        },
        "steps": steps,
        "rows_per_step": round(rows_total / max(1, steps), 2),
        "row_steps": rows_total,
        "mean_past_len": round(slots_total / max(1, rows_total), 1),
        "decoder_calls_per_step": round(calls_total / max(1, steps), 2),
        "step_busy_fraction": round(busy_s / wall, 3),
        "queue_wait_mean_ms": round(1000 * statistics.mean(waits), 1) if waits else None,
        "engine_s": {key: round(value, 2) for key, value in timers.total.items()},
        "calls": dict(timers.calls),
    }


def _hold_the_loop(seconds: float) -> None:
    """Pure-Python work on the event loop's thread, holding the GIL as request handling does
    (the service spends about 3.6 ms of it per request at 70 req/s: py-spy)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        sum(range(200))


def _percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def load_main(args: argparse.Namespace) -> None:
    import asyncio

    results = []
    for policy in args.policies.split(","):
        run = _load_run(
            args.model,
            policy,
            args.load,
            args.duration,
            args.seed,
            args.threads,
            args.mix,
            args.profile,
            args.loop_work_ms / 1000,
        )
        results.append(asyncio.run(run))
        print(json.dumps(results[-1]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="/tmp/interim_onnx")
    parser.add_argument("--ref", default="", help="git revision to compare against (A/B)")
    parser.add_argument("--every", type=int, default=4, help="a short request every N steps")
    parser.add_argument("--long-tokens", type=int, default=60)
    parser.add_argument("--shorts", type=int, default=14)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default="")
    parser.add_argument(
        "--load", type=float, default=0.0, help="high-arrival replay at this rate (req/s)"
    )
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument(
        "--loop-work-ms",
        type=float,
        default=0.0,
        help="--load: pure-Python work (ms) on the event loop per request, as HTTP handling",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mix",
        type=parse_weights,
        default=parse_weights("ui=0.8,help=0.2"),
        help="--load: input categories as loadtest takes them (default: machine_shapes.sh's)",
    )
    parser.add_argument("--policies", default="continuous,static")
    parser.add_argument("--profile", action="store_true", help="cProfile the continuous run")
    args = parser.parse_args()
    if args.load:
        load_main(args)
        return

    variants: dict[str, Engine] = {}
    if args.ref:
        ref_engine_cls = load_ref(args.ref)
        variants["ref"] = ref_engine_cls.from_dir(
            args.model, provider="cpu", intra_op_threads=args.threads
        )
    variants["new"] = Engine.from_dir(args.model, provider="cpu", intra_op_threads=args.threads)
    timers = {name: instrument(engine) for name, engine in variants.items()}
    tokenizer = Tokenizer.from_dir(variants["new"].model_dir)
    for engine in variants.values():
        engine.warmup()

    report: dict = {
        "model": args.model,
        "ref": args.ref,
        "every": args.every,
        "reps": args.reps,
        "threads": args.threads,
        "python": platform.python_version(),
        "scenarios": {},
    }
    for beam in [int(b) for b in args.beams.split(",")]:
        schedule, requests = make_schedules(
            tokenizer, beam, args.every, args.long_tokens, args.shorts
        )
        ids = [request.request_id for request in requests]
        mixed: dict[str, list] = defaultdict(list)
        alone: dict[str, list] = defaultdict(list)
        for _ in range(args.reps):  # interleaved: ref, new, ref, new, ...
            for name, engine in variants.items():
                mixed[name].append(replay(engine, timers[name], schedule))
                runs = [replay(engine, timers[name], {0: [request]}) for request in requests]
                merged = {
                    key: sum(run[key] for run in runs)
                    for key in runs[0]
                    if key not in ("latency_s", "tokens")
                }
                merged["latency_s"] = {k: v for run in runs for k, v in run["latency_s"].items()}
                merged["tokens"] = {k: v for run in runs for k, v in run["tokens"].items()}
                alone[name].append(merged)
        scenario: dict = {}
        reference_tokens = mixed["new"][0]["tokens"]
        for name in variants:
            for run in mixed[name] + alone[name]:
                assert run["tokens"] == reference_tokens, f"{name}: tokens differ"
            m, a = summarize(mixed[name], ids), summarize(alone[name], ids)
            short_ids = [str(i) for i in ids[1:]]
            ratios = [m["latency_ms"][i] / a["latency_ms"][i] for i in short_ids]
            scenario[name] = {
                "mixed": m,
                "alone": a,
                "long_latency_vs_alone": round(
                    m["latency_ms"]["long"] / a["latency_ms"]["long"], 3
                ),
                "short_latency_vs_alone_mean": round(statistics.mean(ratios), 3),
                "short_latency_mixed_mean_ms": round(
                    statistics.mean(m["latency_ms"][i] for i in short_ids), 3
                ),
                "short_latency_alone_mean_ms": round(
                    statistics.mean(a["latency_ms"][i] for i in short_ids), 3
                ),
            }
        scenario["tokens_out"] = {str(k): len(v) for k, v in reference_tokens.items()}
        if "ref" in variants:
            new, ref = scenario["new"], scenario["ref"]
            scenario["new_over_ref"] = {
                "mixed_wall": round(new["mixed"]["wall_ms"] / ref["mixed"]["wall_ms"], 3),
                "mixed_per_step": round(
                    new["mixed"]["per_step_ms"] / ref["mixed"]["per_step_ms"], 3
                ),
                "mixed_add": round(new["mixed"]["add_total_ms"] / ref["mixed"]["add_total_ms"], 3),
                "alone_wall": round(new["alone"]["wall_ms"] / ref["alone"]["wall_ms"], 3),
                "short_latency_mixed": round(
                    new["short_latency_mixed_mean_ms"] / ref["short_latency_mixed_mean_ms"], 3
                ),
                "long_latency_mixed": round(
                    new["mixed"]["latency_ms"]["long"] / ref["mixed"]["latency_ms"]["long"], 3
                ),
            }
        report["scenarios"][f"beam{beam}"] = scenario
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
