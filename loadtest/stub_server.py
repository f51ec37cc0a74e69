"""A stand-in for the translation service, for trying the load tests without a model.

It speaks the parts of the API the load tests use (``POST /v1/translate``, ``GET /ready``,
``GET /metrics``) and simulates a batcher with ``--slots`` concurrent rows: each text holds
a slot for ``--base-ms`` + ``--per-char-ms`` × its length, and waits in a bounded queue
first (429 with ``Retry-After`` when it is full). Its "translation" is the upper-cased input.

    .venv/bin/python -m loadtest.stub_server --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def create_stub_app(
    *, slots: int = 4, base_ms: float = 20.0, per_char_ms: float = 0.2, max_queue: int = 64
) -> FastAPI:
    app = FastAPI(title="mt stub")
    semaphore = asyncio.Semaphore(slots)
    state: dict[str, Any] = {
        "waiting": 0,
        "tokens": 0,
        "requests": 0,
        "queue_wait_counts": [0] * (len(QUEUE_WAIT_BUCKETS) + 1),
        "queue_wait_sum": 0.0,
    }

    def observe_queue_wait(seconds: float) -> None:
        for i, bound in enumerate(QUEUE_WAIT_BUCKETS):
            if seconds <= bound:
                state["queue_wait_counts"][i] += 1
                break
        else:
            state["queue_wait_counts"][-1] += 1
        state["queue_wait_sum"] += seconds

    async def translate_one(text: str) -> tuple[str, int]:
        queued_at = time.perf_counter()
        async with semaphore:
            observe_queue_wait(time.perf_counter() - queued_at)
            await asyncio.sleep((base_ms + per_char_ms * len(text)) / 1000)
        tokens = max(1, len(text) // 4)
        state["tokens"] += tokens
        return text.upper(), tokens

    @app.get("/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/v1/translate")
    async def translate(request: Request) -> JSONResponse:
        body = await request.json()
        texts = [body["text"]] if isinstance(body["text"], str) else list(body["text"])
        if state["waiting"] + len(texts) > max_queue:
            return JSONResponse(
                {"error": "queue full", "code": "queue_full"},
                status_code=429,
                headers={"Retry-After": "1"},
            )
        state["waiting"] += len(texts)
        state["requests"] += 1
        started = time.perf_counter()
        try:
            results = await asyncio.gather(*(translate_one(t) for t in texts))
        finally:
            state["waiting"] -= len(texts)
        translations = [
            {"text": text, "tokens": tokens, "sentences": 1} for text, tokens in results
        ]
        return JSONResponse(
            {
                "translations": translations,
                "model": "stub",
                "usage": {"output_tokens": sum(t for _, t in results), "sentences": len(texts)},
                "time_ms": (time.perf_counter() - started) * 1000,
            }
        )

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        lines = [
            "# TYPE stub_queue_wait_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip(QUEUE_WAIT_BUCKETS, state["queue_wait_counts"], strict=False):
            cumulative += count
            lines.append(f'stub_queue_wait_seconds_bucket{{le="{bound}"}} {cumulative}')
        cumulative += state["queue_wait_counts"][-1]
        lines += [
            f'stub_queue_wait_seconds_bucket{{le="+Inf"}} {cumulative}',
            f"stub_queue_wait_seconds_count {cumulative}",
            f"stub_queue_wait_seconds_sum {state['queue_wait_sum']}",
            "# TYPE stub_generated_tokens counter",
            f"stub_generated_tokens_total {state['tokens']}",
            f"stub_generated_tokens_created {time.time()}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    return app


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m loadtest.stub_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--base-ms", type=float, default=20.0)
    parser.add_argument("--per-char-ms", type=float, default=0.2)
    parser.add_argument("--max-queue", type=int, default=64)
    args = parser.parse_args(argv)
    app = create_stub_app(
        slots=args.slots,
        base_ms=args.base_ms,
        per_char_ms=args.per_char_ms,
        max_queue=args.max_queue,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
