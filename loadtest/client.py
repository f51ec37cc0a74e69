"""Shared machinery of the load tests: request records, the async HTTP client, /metrics
scraping, a spawned server, and the command-line options every script has.

Times are offsets in seconds from the start of a run (``time.perf_counter`` based), so a
record says both when the request *should* have been sent (``scheduled_s``) and when it was
(``sent_s``). Latency is measured from the scheduled time: if the load generator falls
behind, its lag counts against the service's latency instead of disappearing (no
coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from loadtest.inputs import DEFAULT_WEIGHTS, InputSampler, parse_weights
from loadtest.raw_http import RawClients, httpx_client

DEFAULT_URL = "http://127.0.0.1:8000"
TRANSLATE_PATH = "/v1/translate"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

# Status recorded when no HTTP response came back (timeout, refused connection, ...).
STATUS_TRANSPORT_ERROR = 0
# Status recorded for a request the open-loop sender did not send: the in-flight cap was full.
STATUS_DROPPED = -1


@dataclass
class RequestRecord:
    """One request, sent or dropped. Offsets are seconds from the start of the run."""

    index: int
    scheduled_s: float
    sent_s: float | None = None
    latency_s: float | None = None  # completion - scheduled_s
    status: int = STATUS_TRANSPORT_ERROR
    error: str | None = None
    input_chars: int = 0
    output_chars: int = 0
    output_tokens: int | None = None  # from the response's "usage", when it has one
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def dropped(self) -> bool:
        return self.status == STATUS_DROPPED

    @property
    def completed_s(self) -> float | None:
        return None if self.latency_s is None else self.scheduled_s + self.latency_s

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def input_chars(payload: Mapping[str, Any]) -> int:
    text = payload.get("text", "")
    return len(text) if isinstance(text, str) else sum(len(t) for t in text)


def make_client(max_connections: int, timeout_s: float) -> Any:
    """An async client whose pool can hold every in-flight request, so requests do not wait
    for a connection inside the client (that wait would still count, but hide the reason).

    Plain-HTTP targets get :class:`loadtest.raw_http.RawClients` (keep-alive HTTP/1.1 on
    asyncio streams): the generator shares the machine with the service, and httpx's
    per-request CPU is the service's loss (``MT_LOADTEST_HTTPX=1`` picks httpx anyway)."""
    if not os.environ.get("MT_LOADTEST_HTTPX"):
        return RawClients(max_connections, timeout_s)
    return httpx_client(max_connections, timeout_s)


async def send_translate(
    client: httpx.AsyncClient,
    url: str,
    payload: Mapping[str, Any],
    record: RequestRecord,
    clock_start: float,
) -> RequestRecord:
    """POST one translate request and fill ``record``; never raises for HTTP or network errors."""
    record.sent_s = time.perf_counter() - clock_start
    record.input_chars = input_chars(payload)
    try:
        response = await client.post(url.rstrip("/") + TRANSLATE_PATH, json=payload)
    except httpx.HTTPError as exc:
        record.latency_s = time.perf_counter() - clock_start - record.scheduled_s
        record.status = STATUS_TRANSPORT_ERROR
        record.error = f"{type(exc).__name__}: {exc}"[:200]
        return record
    record.latency_s = time.perf_counter() - clock_start - record.scheduled_s
    record.status = response.status_code
    if response.status_code == 200:
        _read_translation(response, record)
    else:
        record.error = response.text[:200]
        retry_after = response.headers.get("retry-after")
        with contextlib.suppress(ValueError):
            record.retry_after_s = float(retry_after) if retry_after is not None else None
    return record


def _read_translation(response: httpx.Response, record: RequestRecord) -> None:
    try:
        body = response.json()
        translations = body["translations"]
        record.output_chars = sum(len(t.get("text", "")) for t in translations)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        record.error = f"unexpected response body: {exc}"[:200]
        return
    usage = body.get("usage") if isinstance(body, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
        record.output_tokens = usage["output_tokens"]
    elif all(isinstance(t.get("tokens"), int) for t in translations):
        record.output_tokens = sum(t["tokens"] for t in translations)


# --- /metrics ----------------------------------------------------------------------------

_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

MetricSamples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_prometheus_text(text: str) -> MetricSamples:
    """Prometheus text exposition → ``{(name, sorted label pairs): value}``."""
    samples: MetricSamples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_LINE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        label_pairs = tuple(sorted(_LABEL.findall(labels or "")))
        samples[(name, label_pairs)] = number
    return samples


async def scrape_metrics(client: httpx.AsyncClient, url: str) -> MetricSamples | None:
    """The service's /metrics, parsed; None when there is none (the report degrades)."""
    try:
        response = await client.get(url.rstrip("/") + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse_prometheus_text(response.text)


# --- safety: loopback only unless asked ---------------------------------------------------


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_target(url: str, allow_remote: bool) -> None:
    if not is_loopback_url(url) and not allow_remote:
        raise SystemExit(
            f"refusing to send load to {url}: not a loopback address. Pass --allow-remote to "
            "load-test a host you own."
        )


# --- a spawned server ---------------------------------------------------------------------


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def service_command(port: int) -> list[str]:
    return [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)]


@contextlib.contextmanager
def spawned_server(
    model_dir: str | os.PathLike[str] | None,
    *,
    command: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 300.0,
    stop_timeout_s: float = 60.0,
    log_path: Path | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Iterator[str]:
    """Start the service on a free loopback port, wait for ``GET /ready``, yield its URL,
    and stop it with SIGTERM (SIGKILL after ``stop_timeout_s``) however the run ends.

    ``command`` (``{port}`` is replaced) replaces ``python -m service`` — the tests use a stub.
    ``cwd``: the checkout it runs from (``python -m`` imports from there; default this one).
    """
    with spawned_process(
        model_dir,
        command=command,
        extra_env=extra_env,
        ready_timeout_s=ready_timeout_s,
        stop_timeout_s=stop_timeout_s,
        log_path=log_path,
        cwd=cwd,
    ) as (url, _):
        yield url


@contextlib.contextmanager
def spawned_process(
    model_dir: str | os.PathLike[str] | None,
    *,
    command: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 300.0,
    stop_timeout_s: float = 60.0,
    log_path: Path | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """``spawned_server`` that also yields the process (for its pid, or to signal it)."""
    port = free_loopback_port()
    argv = (
        [part.replace("{port}", str(port)) for part in command]
        if command
        else service_command(port)
    )
    env = dict(os.environ)
    if model_dir is not None:  # relative to this checkout, wherever the service runs from
        env["MT_EXPORTS"] = str(Path(REPO_ROOT, model_dir))
    env.update(extra_env or {})
    url = f"http://127.0.0.1:{port}"
    log_file = open(log_path, "wb") if log_path else None  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(
        argv,
        cwd=cwd or REPO_ROOT,
        env=env,
        stdout=log_file or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log_file else subprocess.DEVNULL,
    )
    try:
        _wait_ready(url, process, ready_timeout_s, log_path)
        yield url, process
    finally:
        _stop(process, stop_timeout_s)
        if log_file:
            log_file.close()


def _wait_ready(
    url: str, process: subprocess.Popen, timeout_s: float, log_path: Path | None
) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {process.returncode} before it was ready"
                    + (f"; see {log_path}" if log_path else "")
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url + "/ready").status_code == 200:
                    return
            time.sleep(0.25)
    raise TimeoutError(f"the server at {url} was not ready after {timeout_s:.0f} s")


def exit_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a CI timeout) end a run the way Ctrl-C does: as an exception,
    so every ``spawned_server`` block stops its server on the way out. Python's default action
    ends the process at once and leaves spawned servers running, taking the CPU from whatever
    is timed next."""
    signal.signal(signal.SIGTERM, _exit_for_signal)


def _exit_for_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop(process: subprocess.Popen, timeout_s: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


# --- command line -------------------------------------------------------------------------


def add_common_arguments(parser: argparse.ArgumentParser, *, default_name: str) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--url", default=DEFAULT_URL, help="service base URL (default %(default)s)")
    target.add_argument(
        "--spawn-server",
        metavar="MODEL_DIR",
        help="start `python -m service` with MT_EXPORTS=MODEL_DIR on a free loopback port, "
        "run against it, and stop it at the end (ignores --url)",
    )
    target.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for --spawn-server, e.g. MT_MAX_BATCH_ROWS=32 (repeatable)",
    )
    target.add_argument(
        "--server-command",
        metavar="CMD",
        help="with --spawn-server: run this instead of `python -m service --host 127.0.0.1 "
        "--port {port}` ({port} is replaced by the free port)",
    )
    target.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds to wait for /ready"
    )
    target.add_argument(
        "--server-cpus",
        metavar="LIST",
        help="with --spawn-server: run the service under `taskset -c LIST` (e.g. 0, or 0-1): "
        "a pod of that many CPUs; the service counts its cores from the affinity",
    )
    target.add_argument(
        "--client-cpus",
        metavar="LIST",
        help="pin this load generator to these CPUs (e.g. 1), away from the server's",
    )
    target.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --url (default: refuse)"
    )

    inputs = parser.add_argument_group("inputs")
    inputs.add_argument("--seed", type=int, default=0, help="input sampling and arrival seed")
    inputs.add_argument(
        "--mix",
        type=parse_weights,
        default=dict(DEFAULT_WEIGHTS),
        help="category weights, e.g. ui=0.7,help=0.3 (default)",
    )
    inputs.add_argument("--texts-per-request", type=int, default=1)
    inputs.add_argument("--beam-size", type=int, default=None)
    inputs.add_argument("--max-new-tokens", type=int, default=None)

    output = parser.add_argument_group("output")
    output.add_argument(
        "--name", default=default_name, help="results file stem (default %(default)s)"
    )
    output.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    output.add_argument("--no-plot", action="store_true", help="skip the PNG")
    output.add_argument(
        "--timeout", type=float, default=30.0, help="per-request timeout in seconds"
    )


def sampler_from_args(args: argparse.Namespace, seed: int | None = None) -> InputSampler:
    """The sampler the arguments describe (``seed``: another than ``args.seed``)."""
    return InputSampler(
        seed=args.seed if seed is None else seed,
        weights=args.mix,
        texts_per_request=args.texts_per_request,
        beam_size=args.beam_size,
        max_new_tokens=args.max_new_tokens,
    )


def parse_env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--server-env wants KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def cpu_list(text: str) -> set[int]:
    """``taskset``'s list syntax: ``0``, ``0-3``, ``0,2,5-7``."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise SystemExit(f"not a CPU list: {text!r} (want e.g. 0, 0-3 or 0,2)")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def server_command(args: argparse.Namespace) -> list[str] | None:
    """The spawned service's command line: ``--server-command`` or the default, under
    ``taskset -c`` with ``--server-cpus`` (``{port}`` is left for ``spawned_process``)."""
    command = shlex.split(args.server_command) if args.server_command else None
    if not getattr(args, "server_cpus", None):
        return command
    cpu_list(args.server_cpus)  # refuse a bad list before starting anything
    base = command or service_command(0)[:-1] + ["{port}"]
    return ["taskset", "-c", args.server_cpus, *base]


def pin_client(args: argparse.Namespace) -> None:
    """Pin this process (the load generator) to ``--client-cpus``, and say where both run."""
    if getattr(args, "client_cpus", None):
        os.sched_setaffinity(0, cpu_list(args.client_cpus))
    if getattr(args, "server_cpus", None) or getattr(args, "client_cpus", None):
        print(
            f"server on CPUs {args.server_cpus or 'any'}, load generator on CPUs "
            f"{sorted(os.sched_getaffinity(0))}",
            flush=True,
        )


@contextlib.contextmanager
def target_url(args: argparse.Namespace) -> Iterator[str]:
    """The URL to load: a spawned server's (stopped on exit) or ``--url`` after the loopback check."""
    pin_client(args)
    if args.spawn_server:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        log_path = args.results_dir / f"{args.name}.server.log"
        print(f"starting the service on {args.spawn_server} (log: {log_path}) ...", flush=True)
        with spawned_server(
            args.spawn_server,
            command=server_command(args),
            extra_env=parse_env_pairs(args.server_env),
            ready_timeout_s=args.ready_timeout,
            log_path=log_path,
        ) as url:
            print(f"service ready at {url}", flush=True)
            yield url
        return
    check_target(args.url, args.allow_remote)
    yield args.url


def run_async(coroutine: Any) -> Any:
    """``asyncio.run`` (on uvloop when it is installed: every cycle the generator saves is
    one the service on the same machine gets) that turns Ctrl+C into a clean exit code."""
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(coroutine)
        return uvloop.run(coroutine)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
