"""What a request costs the web framework alone, beside what it costs mtserve: the floor under
the event loop's share of a served request.

    .venv/bin/python -m bench.framework_floor [--pairs 2] [--duration 15] [--model build/onnx/default]

Two servers, each alone on ``--server-cpus`` with ``--concurrency`` closed-loop clients on
``--client-cpus`` sending the same held-out interface strings to ``POST /v1/translate``,
alternating ``--pairs`` times:

- ``bare``: this module's ``app``, FastAPI under uvicorn (uvloop, httptools, uvicorn's access
  line on, as ``make serve`` logs text): a pydantic request model, the text echoed back in
  mtserve's own response model. No middleware, no text work, no engine: the framework's
  floor;
- ``mtserve``: ``python -m service`` serving ``--model`` in one process, as ``make serve`` runs
  on a machine with fewer than four CPUs.

Each gives its requests a second and the CPU a request of the whole process (``/proc``).
mtserve's CPU a request minus the engine's ONNX Runtime calls (bench/request_stages.py splits
them) is the Python a request costs; ``bare`` says how much of that no application code can
remove without leaving FastAPI and uvicorn.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from service.web.schemas import TranslateResponse, Translation, Usage

app = FastAPI()


class TranslateRequest(BaseModel):
    text: str
    source_lang: str
    target_lang: str


@app.post("/v1/translate", response_model=TranslateResponse)
async def translate(request: TranslateRequest) -> TranslateResponse:
    """The text echoed in mtserve's own response model (the same validation and JSON)."""
    return TranslateResponse(
        translations=[Translation(text=request.text, tokens=2, sentences=1)],
        model="default",
        models=["default"],
        source_lang=request.source_lang,
        target_lang=request.target_lang,
        usage=Usage(input_tokens=3, output_tokens=2, sentences=1),
        time_ms=0.0,
    )


@app.get("/ready")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


def bare_command(server_cpus: str) -> list[str]:
    return [
        "taskset", "-c", server_cpus, sys.executable, "-m", "uvicorn",
        "bench.framework_floor:app", "--host", "127.0.0.1", "--port", "{port}",
        "--loop", "uvloop", "--http", "httptools",
    ]  # fmt: skip


def mtserve_command(server_cpus: str) -> list[str]:
    return [
        "taskset", "-c", server_cpus, sys.executable, "-m", "service",
        "--host", "127.0.0.1", "--port", "{port}",
    ]  # fmt: skip


def one_run(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    from bench.request_stages import closed_loop
    from loadtest.client import spawned_process
    from loadtest.cpu_accounting import process_cpu_seconds

    command = (bare_command if arm == "bare" else mtserve_command)(args.server_cpus)
    env = {"MT_PROCESS_MODE": "single"}
    with spawned_process(args.model, command=command, extra_env=env) as (url, process):
        closed_loop(url, args.concurrency, args.warmup, seed + 1000)
        cpu_before = process_cpu_seconds(process.pid) or 0.0
        summary = closed_loop(url, args.concurrency, args.duration, seed)
        cpu_s = (process_cpu_seconds(process.pid) or 0.0) - cpu_before
    ok = summary["ok"]
    return {
        "arm": arm,
        "rps": summary["throughput_rps"],
        "ok": ok,
        "failed": summary["failed"],
        "cpu_ms_per_request": 1e3 * cpu_s / ok if ok else None,
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
    }


def main(argv: list[str] | None = None) -> int:
    from loadtest.client import cpu_list
    from loadtest.machine import machine_facts

    parser = argparse.ArgumentParser(prog="python -m bench.framework_floor", description=__doc__)
    parser.add_argument("--model", default="build/onnx/default")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument("--out", type=Path, default=Path("bench/results/framework_floor.json"))
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, cpu_list(args.client_cpus))
    runs = []
    for pair in range(args.pairs):
        for arm in ("bare", "mtserve") if pair % 2 == 0 else ("mtserve", "bare"):
            run = one_run(args, arm, seed=pair)
            print(json.dumps(run), flush=True)
            runs.append(run)
    result = {
        "machine": machine_facts(),
        "config": vars(args) | {"out": str(args.out)},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
