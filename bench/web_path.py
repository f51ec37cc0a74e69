"""The event loop's CPU per request in the app itself: the ASGI app driven in-process, no
sockets, no HTTP parser, no client on the loop's thread.

    PYTHONPATH=<checkout> .venv/bin/python bench/web_path.py --model build/onnx/default \\
        [--route /translate] [--requests 600] [--concurrency 32] [--profile out.pstats]

The app (``service.wiring.create_app``, the checkout's on ``PYTHONPATH``) serves the model
with its engine thread as in ``python -m service``; this script calls it as uvicorn would,
``--concurrency`` requests at a time (held-out interface strings, bench/heldout), and divides
the CPU clock of the loop's thread (``time.thread_time``) by the requests answered. The
engine's threads, and every wait, are not counted, so the figure holds on a busy machine:
what it leaves out is uvicorn's part (HTTP parsing, the access line; bench/request_stages.py
measures the whole process). ``--profile`` writes cProfile's statistics of the loop thread.
``--web-only`` answers every request after the warm-up with one canned dispatcher result:
no text work and no engine, the web layer's own CPU (middleware, route, validation,
serialisation), steadier on a busy machine.

``--code`` names checkouts to compare (``--code /work/main --code .``): each run is a fresh
process with that checkout's ``service`` (``PYTHONPATH``), the checkouts alternating
``--pairs`` times; the summary gives each pair's ratio (the first checkout's CPU a request
over the others'), so a machine that is busy in one stretch skews no comparison much.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HELDOUT = Path(__file__).resolve().parent / "heldout" / "ui_strings_en_de.json"


def texts(seed: int) -> list[str]:
    import random

    data = json.loads(HELDOUT.read_text())
    found = sorted(t for project in data["strings"].values() for t in project["en"]["short"])
    random.Random(seed).shuffle(found)
    return found


def body_of(route: str, text: str) -> bytes:
    if route == "/translate":
        return json.dumps({"q": text, "source": "en", "target": "de"}).encode()
    return json.dumps({"text": text, "source_lang": "en", "target_lang": "de"}).encode()


async def call(app: Any, route: str, body: bytes) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST" if body else "GET",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    sent = False
    status, chunks = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # a client that stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def lifespan(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[Any]]:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put)
    )
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(started)
    return task, inbox


def canned_results(route: str) -> None:
    """From now on every request of ``route`` gets the next answer of the dispatcher, the
    last one the route had: no text work and no engine, so the loop's CPU is the web
    layer's own (``--web-only``). The route modules call ``collect`` by that name."""
    import importlib

    module = importlib.import_module(
        "service.web.routes.v1" if route == "/v1/translate" else "service.web.routes.libretranslate"
    )
    collect = module.collect
    kept: list[Any] = []

    async def canned(started: Any) -> Any:
        if kept:
            started.close()  # the dispatcher's coroutine, never started
            return kept[0]
        kept.append(await collect(started))
        return kept[0]

    module.collect = canned


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.wiring import create_app

    app = create_app()
    # As serve() does for a served process (service/web/frozen_heap.py); older checkouts ignore it.
    app.state.service.freeze_heap = True
    task, inbox = await lifespan(app)
    deadline = time.monotonic() + 300
    while (await call(app, "/ready", b""))[0] != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the model did not become ready")
        await asyncio.sleep(0.2)
    pool = texts(args.seed)
    bodies = [body_of(args.route, pool[i % len(pool)]) for i in range(args.requests)]
    warm = [body_of(args.route, t) for t in pool[: args.concurrency * 4]]

    async def drive(work: list[bytes]) -> list[int]:
        statuses: list[int] = []
        queue = iter(work)

        async def client() -> None:
            for body in queue:
                statuses.append((await call(app, args.route, body))[0])

        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        return statuses

    await drive(warm)
    if args.web_only:
        canned_results(args.route)
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    begun: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            begun.append(time.thread_time())
        elif begun:
            pauses[info["generation"]].append(time.thread_time() - begun.pop())

    gc.callbacks.append(on_gc)
    # The thread's CPU clock: on a busy machine wall-clock times would charge waits for a core.
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    cpu, wall = time.thread_time(), time.perf_counter()
    if profile:
        profile.enable()
    statuses = await drive(bodies)
    if profile:
        profile.disable()
        profile.dump_stats(args.profile)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    gc.callbacks.remove(on_gc)
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, 60)
    ok = sum(status == 200 for status in statuses)
    import service

    return {
        "service_package": str(Path(service.__file__).parent),
        "route": args.route,
        "web_only": args.web_only,
        "requests": len(statuses),
        "ok": ok,
        "concurrency": args.concurrency,
        "loop_cpu_ms_per_request": round(cpu * 1000 / max(ok, 1), 4),
        "wall_s": round(wall, 2),
        # Collections of the cyclic garbage collector in the window (any thread's): each
        # stops every thread that needs the GIL, the event loop included.
        "gc": {
            f"gen{generation}": {
                "count": len(times),
                "total_ms": round(1000 * sum(times), 1),
                "max_ms": round(1000 * max(times), 1) if times else 0.0,
            }
            for generation, times in pauses.items()
        },
        "objects_tracked": len(gc.get_objects()),
        "python": platform.python_version(),
    }


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Alternate the ``--code`` checkouts, one process a run (A B, B A, ...); each run's
    result, and each pair's ratio of loop CPU a request, the first checkout's over each
    other's (above 1: the other spends less)."""
    import subprocess

    child = [
        *("--model", args.model, "--route", args.route, "--requests", str(args.requests)),
        *("--concurrency", str(args.concurrency), "--seed", str(args.seed)),
        *(["--web-only"] if args.web_only else []),
    ]
    runs: dict[str, list[dict[str, Any]]] = {code: [] for code in args.code}
    for pair in range(args.pairs):
        for code in args.code if pair % 2 == 0 else reversed(args.code):
            done = subprocess.run(
                [sys.executable, __file__, *child],
                env={**os.environ, "PYTHONPATH": str(Path(code).resolve())},
                check=True,
                capture_output=True,
                text=True,
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps({"code": code, "pair": pair, **result}), file=sys.stderr, flush=True)
            runs[code].append(result)
    ms = {code: [r["loop_cpu_ms_per_request"] for r in found] for code, found in runs.items()}
    first = args.code[0]
    return {
        "route": args.route,
        "ms_per_request": ms,
        "ratios_first_over": {
            code: [round(a / b, 3) for a, b in zip(ms[first], ms[code], strict=True)]
            for code in args.code[1:]
        },
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="build/onnx/default")
    parser.add_argument("--route", default="/translate", choices=["/translate", "/v1/translate"])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default=None, help="write cProfile stats here")
    parser.add_argument(
        "--web-only",
        action="store_true",
        help="after the warm-up, every request gets one canned result: the web layer alone",
    )
    parser.add_argument("--code", action="append", default=[], help="checkouts to alternate")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.code:
        print(json.dumps(compare(args)))
        return 0
    os.environ.setdefault("MT_MODEL_DIR", str(Path(args.model).resolve()))
    os.environ.setdefault("MT_PROCESS_MODE", "single")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
