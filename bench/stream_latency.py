"""What streaming buys a client: time to the first translated sentence vs the whole response.

    .venv/bin/python bench/stream_latency.py [--model build/onnx/default] [--sentences 12]
        [--reps 5] [--beam 1] [--threads 2] [--output bench/results]

Serves the model on a local socket (uvicorn in a thread, the real app) and sends one text of
``--sentences`` UI sentences, alternately to ``POST /v1/translate`` (time to the response) and
``POST /v1/translate/stream`` (time to the first ``sentence`` event, to the ``done`` event).
Prints medians (ms) and writes them with the machine's CPU flags as JSON. Run it alone:
``flock -x /tmp/cpu.lock`` on shared machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.machine import machine_facts  # noqa: E402
from service.config import Settings  # noqa: E402
from tests.live_server import live_server  # noqa: E402

SENTENCES = [
    "Save your changes before you close the window.",
    "The file could not be opened because it is used by another program.",
    "Do you want to replace the existing file?",
    "Your password must contain at least eight characters.",
    "Click the button below to download the latest version.",
    "The connection to the server was lost.",
    "Please try again in a few minutes.",
    "All selected items will be deleted permanently.",
    "You can change this setting later in the preferences.",
    "The search returned no results for your query.",
    "This account has been locked after too many failed attempts.",
    "Open the folder that contains the downloaded files.",
]


def once(base: str, body: dict) -> tuple[float, float, float]:
    """(whole response ms, first streamed sentence ms, streamed done ms)."""
    started = time.perf_counter()
    response = httpx.post(f"{base}v1/translate", json=body, timeout=300)
    response.raise_for_status()
    whole = (time.perf_counter() - started) * 1000
    first = done = float("nan")
    started = time.perf_counter()
    with httpx.stream("POST", f"{base}v1/translate/stream", json=body, timeout=300) as stream:
        for line in stream.iter_lines():
            now = (time.perf_counter() - started) * 1000
            if line == "event: sentence" and first != first:
                first = now
            elif line == "event: done":
                done = now
    return whole, first, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=ROOT / "build/onnx/default")
    parser.add_argument("--sentences", type=int, default=12)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    text = " ".join((SENTENCES * (args.sentences // len(SENTENCES) + 1))[: args.sentences])
    settings = Settings(exports=[args.model], provider="cpu", intra_op_threads=args.threads)
    body = {"text": text, "beam_size": args.beam}
    with live_server(settings) as base:
        once(base, body)  # warm-up
        runs = [once(base, body) for _ in range(args.reps)]
    whole, first, done = (statistics.median(column) for column in zip(*runs, strict=True))
    result = {
        "bench": "stream_latency",
        "model": str(args.model),
        "sentences": args.sentences,
        "beam": args.beam,
        "threads": args.threads,
        "reps": args.reps,
        "whole_response_ms": round(whole, 1),
        "stream_first_sentence_ms": round(first, 1),
        "stream_done_ms": round(done, 1),
        "machine": machine_facts(),
    }
    print(json.dumps(result))
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"stream_latency_{args.sentences}s_beam{args.beam}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
