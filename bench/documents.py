"""What a long document costs, and what it costs everyone else: a generated N-page docx as a
document job (``POST /v1/documents``), with and without interactive traffic beside it.

    .venv/bin/python bench/documents.py [--model build/onnx/default] [--pages 50]
        [--clients 4] [--seconds 20] [--threads 0] [--output bench/results]

Starts the service as a process of its own (``python -m service``, the translation cache off,
so every sentence of the document and of the clients is decoded) and runs three phases from
this process:

1. **interactive alone**: ``--clients`` closed-loop clients, each sending one UI sentence to
   ``POST /v1/translate`` and the next as soon as the answer comes, for ``--seconds``;
2. **document alone**: the docx uploaded and polled until done: wall time, sentences/s;
3. **both**: the document again, with the same interactive clients running until it is done.

Prints and writes (JSON, with the machine's CPU flags) the document's wall time and
sentences/s alone and under load, and the interactive p50/p99 alone and beside the
document (the issue's bar: p99 at most 25 % higher), and for each phase where the server's time
went (engine phases, thread CPU and run-queue shares, from its ``/metrics``). Run it alone: ``flock -x /tmp/cpu.lock``
on shared machines. ``--pages 1 --seconds 2`` checks that it runs. ``--server-env
MT_BACKGROUND_MAX_ROWS=1`` (repeatable) passes settings to the service.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docx
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the same interface sentences as the streaming benchmark's
from stream_latency import SENTENCES  # noqa: E402

from loadtest.client import MetricSamples, parse_prometheus_text, spawned_server  # noqa: E402
from loadtest.machine import machine_facts  # noqa: E402
from loadtest.report import (  # noqa: E402
    ENGINE_PHASE_PATTERN,
    THREAD_CPU_PATTERN,
    THREAD_RUNQUEUE_PATTERN,
    counter_delta_by,
)

POLL_S = 0.2  # the job's status, as a client polls it
PARAGRAPHS_PER_PAGE = 9  # of three sentences each: about a page of a contract or a manual


def build_docx(pages: int) -> bytes:
    """``pages`` pages of paragraphs (some with bold and italic runs) and a small table each."""
    document = docx.Document()
    document.sections[0].header.paragraphs[0].text = "Service agreement"
    sentence = 0
    for page in range(pages):
        document.add_heading(f"Section {page + 1}: terms of use", level=1)
        for _ in range(PARAGRAPHS_PER_PAGE):
            paragraph = document.add_paragraph(SENTENCES[sentence % len(SENTENCES)] + " ")
            paragraph.add_run(SENTENCES[(sentence + 1) % len(SENTENCES)]).bold = True
            paragraph.add_run(" " + SENTENCES[(sentence + 2) % len(SENTENCES)]).italic = True
            sentence += 3
        table = document.add_table(rows=2, cols=2)
        table.cell(0, 0).text = "Name of the file"
        table.cell(0, 1).text = "Size of the folder"
        table.cell(1, 0).text = "Open the window"
        table.cell(1, 1).text = str(page)
        if page + 1 < pages:
            document.add_page_break()
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


class Interactive:
    """Closed-loop clients of ``/v1/translate`` until stopped; latencies in ms."""

    def __init__(self, base: str, clients: int) -> None:
        self.base = base
        self.clients = clients
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _client(self, number: int) -> None:
        with httpx.Client(timeout=300) as client:
            index = number
            while not self._stop.is_set():
                body = {"text": SENTENCES[index % len(SENTENCES)]}
                started = time.perf_counter()
                response = client.post(f"{self.base}v1/translate", json=body)
                elapsed = (time.perf_counter() - started) * 1000
                if response.status_code == 200:
                    self.latencies.append(elapsed)
                else:
                    self.failures += 1
                index += self.clients

    def __enter__(self) -> Interactive:
        self._threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True)
            for n in range(self.clients)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def summary(self) -> dict[str, float]:
        return {
            "requests": len(self.latencies),
            "failures": self.failures,
            "p50_ms": round(statistics.median(self.latencies), 1) if self.latencies else None,
            "p99_ms": round(percentile(self.latencies, 0.99), 1),
        }


def translate_document(base: str, content: bytes) -> dict[str, float]:
    """Upload, poll until done; wall time from upload to done and sentences/s. One client
    polls every ``POLL_S`` (a fresh connection every 50 ms was a load of its own on 2 cores)."""
    started = time.perf_counter()
    with httpx.Client(base_url=base, timeout=300) as client:
        created = client.post(
            "v1/documents",
            data={"source_lang": "en", "target_lang": "de"},
            files={"file": ("agreement.docx", content)},
        )
        created.raise_for_status()
        job_id = created.json()["id"]
        while True:
            status = client.get(f"v1/documents/{job_id}").json()
            if status["status"] not in ("queued", "translating"):
                break
            time.sleep(POLL_S)
        wall = time.perf_counter() - started
        if status["status"] != "done":
            raise RuntimeError(f"the document job ended {status['status']}: {status.get('error')}")
        result = client.get(f"v1/documents/{job_id}/result")
        result.raise_for_status()
    docx.Document(io.BytesIO(result.content))  # it opens
    return {
        "sentences": status["sentences_total"],
        "wall_s": round(wall, 2),
        "sentences_per_s": round(status["sentences_total"] / wall, 1),
    }


def scrape(base: str) -> MetricSamples:
    return parse_prometheus_text(httpx.get(f"{base}metrics", timeout=30).text)


def where_time_went(before: MetricSamples, after: MetricSamples, seconds: float) -> dict:
    """The server's engine thread by phase and its threads' CPU and run-queue wait, each as a
    share of the phase's wall time (why the clients' latency moved)."""

    def shares(pattern: str, label: str) -> dict[str, float]:
        delta = counter_delta_by(before, after, pattern, label) or {}
        return {key: round(value / seconds, 3) for key, value in delta.items() if value}

    return {
        "seconds": round(seconds, 2),
        "engine_phase_share": shares(ENGINE_PHASE_PATTERN, "phase"),
        "thread_cpu_share": shares(THREAD_CPU_PATTERN, "thread"),
        "thread_runqueue_share": shares(THREAD_RUNQUEUE_PATTERN, "thread"),
    }


@contextlib.contextmanager
def server_time(base: str, timelines: dict[str, dict], phase: str) -> Iterator[None]:
    """``timelines[phase]``: where the server's time went while the block ran."""
    started, before = time.perf_counter(), scrape(base)
    yield
    timelines[phase] = where_time_went(before, scrape(base), time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "build" / "onnx" / "default")
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--clients", type=int, default=4, help="interactive closed-loop clients")
    parser.add_argument("--seconds", type=float, default=20.0, help="interactive phase alone")
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads (0: the service's default)"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--server-env", action="append", default=[], help="NAME=VALUE for the service"
    )
    args = parser.parse_args(argv)

    content = build_docx(args.pages)
    with tempfile.TemporaryDirectory() as data_dir:
        env = {
            "MT_PROVIDER": "cpu",
            **({"MT_INTRA_OP_THREADS": str(args.threads)} if args.threads else {}),
            "MT_DATA_DIR": data_dir,
            "MT_FILES_DIR": str(Path(data_dir) / "files"),
            "MT_MAX_BODY_BYTES": str(max(len(content) * 2, 1_000_000)),
            # the document repeats its sentences, and so do the clients: decode them all
            "MT_TRANSLATION_CACHE_SIZE": "0",
            **dict(item.split("=", 1) for item in args.server_env),
        }
        with spawned_server(args.model, extra_env=env) as url:
            base = url.rstrip("/") + "/"
            timelines: dict[str, dict] = {}
            with (
                server_time(base, timelines, "interactive_alone"),
                Interactive(base, args.clients) as alone,
            ):
                time.sleep(args.seconds)
            document_alone = translate_document(base, content)
            with (
                server_time(base, timelines, "interactive_with_document"),
                Interactive(base, args.clients) as beside,
            ):
                document_loaded = translate_document(base, content)

    interactive_alone, interactive_beside = alone.summary(), beside.summary()
    ratio = interactive_beside["p99_ms"] / interactive_alone["p99_ms"]
    report = {
        "pages": args.pages,
        "docx_bytes": len(content),
        "clients": args.clients,
        "server_env": args.server_env,
        "document_alone": document_alone,
        "document_with_interactive": document_loaded,
        "interactive_alone": interactive_alone,
        "interactive_with_document": interactive_beside,
        "p99_ratio": round(ratio, 3),
        "server_time_shares": timelines,
        "machine": machine_facts(),
    }
    print(
        f"{args.pages}-page docx, {document_alone['sentences']} sentences: "
        f"{document_alone['wall_s']} s alone ({document_alone['sentences_per_s']} sentences/s), "
        f"{document_loaded['wall_s']} s beside {args.clients} interactive clients"
    )
    print(
        f"interactive p50/p99 ms: {interactive_alone['p50_ms']} / {interactive_alone['p99_ms']} "
        f"alone, {interactive_beside['p50_ms']} / {interactive_beside['p99_ms']} beside the "
        f"document (p99 x{ratio:.2f}; the bar is x1.25)"
    )
    for phase, timeline in timelines.items():
        print(f"{phase}: shares of wall time, {timeline['seconds']} s")
        for key in ("engine_phase_share", "thread_cpu_share", "thread_runqueue_share"):
            print(f"  {key}: " + ", ".join(f"{k} {v}" for k, v in timeline[key].items()))
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"documents-{args.pages}p.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
