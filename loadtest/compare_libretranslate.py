"""mtserve against LibreTranslate 1.9.6 serving the same weights, on the same CPU.

    loadtest/setup_libretranslate.sh                      # once: its venv and our packages
    .venv/bin/python -m loadtest.compare_libretranslate run --pairs 4 --duration 60

``packages`` (the setup script runs it) converts each shipped model (``models/<name>``,
en→de and de→en) to CTranslate2 int8 with bench/ct2_convert.py and wraps it as an Argos
package: ``metadata.json``, the CTranslate2 ``model/`` (``add_source_eos``: our tokenizer ends
every source with ``</s>``, Argos hands CTranslate2 the bare pieces), the models' one
``sentencepiece.model`` and a blank spaCy pipeline as the package's sentence splitter (the
default splitter, MiniSBD, downloads a model at the first request). It installs them with
``argostranslate.package.install_from_path`` into ``--lt-home`` (its ``XDG_*`` folders), so
nothing is read from or written to the user's own Argos folders and nothing is downloaded.

``run`` starts both servers pinned to ``--server-cpus`` (``taskset``): LibreTranslate offline
(``ARGOS_CHUNK_TYPE=SPACY``, ``ARGOS_INTRA_THREADS=1`` — its threads ignore CPU affinity —,
``--load-only en,de``) and ``python -m service`` serving the shipped exports as ``make serve``
does (its process mode left to the plan, which a 1-CPU pin makes ``single``). This
generator, pinned to ``--client-cpus``, runs the same closed loop against each
(``--concurrency`` clients, one held-out interface string a request, bench/heldout, through
LibreTranslate's ``POST /translate``, which both serve), alternating A B / B A ``--pairs``
times, each arm after a warm-up. Per arm: requests/s, p50/p99, failures; per pair the ratio
mtserve / LibreTranslate. Then resident memory: each server fresh, both directions
translated (LibreTranslate loads a direction's model at its first request), then 50 requests,
then the RSS and PSS of its whole process tree; mtserve in ``single`` and ``multi`` mode.
The CPU model and flags go into the result (loadtest/results/compare_libretranslate.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
HELDOUT = REPO_ROOT / "bench" / "heldout" / "ui_strings_en_de.json"
DEFAULT_LT_VENV = REPO_ROOT / "build" / "libretranslate" / "venv"
DEFAULT_LT_HOME = REPO_ROOT / "build" / "libretranslate" / "home"
SHIPPED = ("default", "de-en")
LT_VERSION = "1.9.6"
WARMUP_PER_DIRECTION = 8
MEMORY_REQUESTS = 50
AGREEMENT_TEXTS = 50


# --- Argos packages ---------------------------------------------------------------------------


def model_pair(model_dir: Path) -> tuple[str, str]:
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    return config["source_lang"], config["target_lang"]


def package_metadata(source: str, target: str, name: str) -> dict[str, Any]:
    from service.translation.languages import language_name

    return {
        "package_version": "1.0",
        "argos_version": "1.9",
        "from_code": source,
        "from_name": language_name(source),
        "to_code": target,
        "to_name": language_name(target),
        "type": "translate",
        "code": f"{source}_{target}",
        "description": f"mtserve's shipped model models/{name}, CTranslate2 int8",
    }


def argos_env(home: Path) -> dict[str, str]:
    """LibreTranslate's and Argos' folders under ``home``, offline."""
    return {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ARGOS_CHUNK_TYPE": "SPACY",
        "ARGOS_INTRA_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }


_BLANK_SPACY = """
import sys, spacy
for path in sys.argv[1:]:
    spacy.blank("xx").to_disk(path)
"""

_INSTALL = """
import sys
from pathlib import Path
import argostranslate.package as package
for path in sys.argv[1:]:
    package.install_from_path(Path(path))
print(sorted(f"{p.from_code}->{p.to_code}" for p in package.get_installed_packages()))
"""


def build_packages(models: Sequence[Path], lt_venv: Path, home: Path, work: Path) -> list[str]:
    """Convert, package and install each model; returns the installed directions."""
    sys.path.insert(0, str(REPO_ROOT))
    from bench.ct2_convert import convert

    python = str(lt_venv / "bin" / "python")
    env = {**os.environ, **argos_env(home)}
    archives, spacy_dirs = [], []
    # Argos' start-up looks for a cached multilingual spaCy model and downloads one where
    # there is none: a blank pipeline in its place keeps it offline.
    cached = home / "cache" / "argos-translate" / "spacy"
    (cached / "senter" / "model").mkdir(parents=True, exist_ok=True)
    spacy_dirs.append(str(cached))
    for model_dir in models:
        source, target = model_pair(model_dir)
        package = work / f"translate-{source}_{target}"
        shutil.rmtree(package, ignore_errors=True)
        package.mkdir(parents=True)
        convert(model_dir, package / "model", "int8")
        config_path = package / "model" / "config.json"
        config = json.loads(config_path.read_text())
        config["add_source_eos"] = True
        config_path.write_text(json.dumps(config, indent=2))
        shutil.copy(model_dir / "source.spm", package / "sentencepiece.model")
        metadata = package_metadata(source, target, model_dir.name)
        (package / "metadata.json").write_text(json.dumps(metadata, indent=2))
        spacy_dirs.append(str(package / "spacy"))
        archives.append(package)
    subprocess.run([python, "-c", _BLANK_SPACY, *spacy_dirs], env=env, check=True)
    zipped = []
    for package in archives:
        archive = package.with_suffix(".argosmodel")
        with zipfile.ZipFile(archive, "w") as zipf:
            for path in sorted(package.rglob("*")):
                zipf.write(path, path.relative_to(package.parent))
        zipped.append(str(archive))
    done = subprocess.run(
        [python, "-c", _INSTALL, *zipped], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


# --- servers ----------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]


def free_port() -> int:
    from loadtest.client import free_loopback_port

    return free_loopback_port()


def our_command(port: int, cpus: str) -> tuple[list[str], dict[str, str]]:
    exports = ",".join(str(REPO_ROOT / "build" / "onnx" / name) for name in SHIPPED)
    command = ["taskset", "-c", cpus, sys.executable, "-m", "service"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    return command, {"MT_EXPORTS": exports, "PYTHONPATH": str(REPO_ROOT)}


def lt_command(port: int, cpus: str, lt_venv: Path, home: Path) -> tuple[list[str], dict[str, str]]:
    command = ["taskset", "-c", cpus, str(lt_venv / "bin" / "libretranslate")]
    command += ["--host", "127.0.0.1", "--port", str(port), "--load-only", "en,de"]
    return command, argos_env(home)


@contextlib.contextmanager
def started(
    name: str, command: list[str], env: dict[str, str], ready_path: str, log: Path
) -> Iterator[Server]:
    import httpx

    port = command[command.index("--port") + 1]
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=out, stderr=out
        )
        try:
            deadline = time.monotonic() + 600
            with httpx.Client(timeout=5.0, trust_env=False) as client:
                while True:
                    if process.poll() is not None:
                        raise RuntimeError(f"{name} exited with {process.returncode}; see {log}")
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(url + ready_path).status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name} was not ready after 600 s; see {log}")
                    time.sleep(0.5)
            yield Server(name, url, process)
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children.get(current, []))
    return found


def tree_memory(pid: int) -> dict[str, Any]:
    """Resident (RSS) and proportional (PSS: shared pages split among their users) memory of
    a process tree, in MB, and each process's RSS. ``taskset`` execs the server, so ``pid``
    is the server itself."""
    total_rss = total_pss = 0
    each = []
    for member in tree_pids(pid):
        fields: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("Rss", "Pss"):
                    fields[key] = int(value.split()[0])
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{member}/cmdline").read_bytes().replace(b"\0", b" ")
        total_rss += fields.get("Rss", 0)
        total_pss += fields.get("Pss", 0)
        each.append(
            {"pid": member, "rss_mb": round(fields.get("Rss", 0) / 1024, 1),
             "command": command.decode(errors="replace")[:120]}
        )  # fmt: skip
    return {
        "rss_mb": round(total_rss / 1024, 1),
        "pss_mb": round(total_pss / 1024, 1),
        "processes": each,
    }


# --- load -------------------------------------------------------------------------------------


def heldout_texts(language: str, seed: int) -> list[str]:
    data = json.loads(HELDOUT.read_text())
    texts = sorted(t for project in data["strings"].values() for t in project[language]["short"])
    random.Random(seed).shuffle(texts)
    return texts


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def closed_loop(
    url: str, texts: list[str], source: str, target: str, concurrency: int, duration_s: float
) -> dict[str, Any]:
    """``concurrency`` clients back to back for ``duration_s`` (``duration_s`` 0: each text
    once); latencies of the requests answered 200."""
    from loadtest.raw_http import RawClients

    latencies: list[float] = []
    failures: dict[str, int] = {}
    cursor = iter(range(10**9))
    once = duration_s <= 0
    async with RawClients(concurrency + 2, 120.0) as client:
        started_at = time.perf_counter()
        deadline = started_at + duration_s

        async def one_client() -> None:
            while True:
                index = next(cursor)
                if once and index >= len(texts):
                    return
                if not once and time.perf_counter() >= deadline:
                    return
                payload = {"q": texts[index % len(texts)], "source": source, "target": target}
                sent = time.perf_counter()
                try:
                    response = await client.post(url + "/translate", json=payload)
                    status = str(response.status_code)
                    ok = response.status_code == 200 and "translatedText" in response.json()
                except Exception as error:  # noqa: BLE001 - a failed request is counted
                    status, ok = type(error).__name__, False
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    failures[status] = failures.get(status, 0) + 1

        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        window = time.perf_counter() - started_at
    return {
        "ok": len(latencies),
        "failed": failures,
        "seconds": round(window, 3),
        "rps": round(len(latencies) / window, 2) if window else None,
        "p50_ms": round(1000 * (percentile(latencies, 0.50) or 0), 1),
        "p99_ms": round(1000 * (percentile(latencies, 0.99) or 0), 1),
    }


def load(url: str, texts: list[str], concurrency: int, duration_s: float, pair=("en", "de")):
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    return runner(closed_loop(url, texts, *pair, concurrency, duration_s))


def warm(url: str, seed: int) -> None:
    """Both directions, so that each server has both models loaded."""
    load(url, heldout_texts("en", seed)[:WARMUP_PER_DIRECTION], 4, 0, ("en", "de"))
    load(url, heldout_texts("de", seed)[:WARMUP_PER_DIRECTION], 4, 0, ("de", "en"))


def translations(url: str, texts: list[str]) -> list[str]:
    import httpx

    with httpx.Client(timeout=60.0, trust_env=False) as client:
        return [
            client.post(url + "/translate", json={"q": t, "source": "en", "target": "de"})
            .json()
            .get("translatedText", "")
            for t in texts
        ]


def agreement(ours: str, lt: str, texts: list[str]) -> dict[str, Any]:
    """How many of ``texts`` both servers translate alike: the same weights, but our greedy
    search against LibreTranslate's beam (``ARGOS_BEAM_SIZE``, 4 unless set) and int8."""
    a, b = translations(ours, texts), translations(lt, texts)
    return {
        "texts": len(texts),
        "identical": sum(x == y for x, y in zip(a, b, strict=True)),
        "examples_differing": [
            {"q": q, "ours": x, "libretranslate": y}
            for q, x, y in zip(texts, a, b, strict=True)
            if x != y
        ][:5],
    }


# --- the run ----------------------------------------------------------------------------------


def summarise(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per pair mtserve / LibreTranslate requests/s and p99; their ranges over the pairs."""
    ratios = [
        p["ours"]["rps"] / p["libretranslate"]["rps"] for p in pairs if p["libretranslate"]["rps"]
    ]
    p99 = [
        p["ours"]["p99_ms"] / p["libretranslate"]["p99_ms"]
        for p in pairs
        if p["libretranslate"]["p99_ms"]
    ]
    spread = {
        arm: [round(p[arm]["p99_ms"] / p[arm]["p50_ms"], 2) for p in pairs if p[arm]["p50_ms"]]
        for arm in ("ours", "libretranslate")
    }
    return {
        "capacity_ratio": [round(r, 3) for r in ratios],
        "capacity_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
        "p99_ratio": [round(r, 3) for r in p99],
        "p99_over_p50": spread,
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    from loadtest.client import cpu_list
    from loadtest.machine import machine_facts

    os.sched_setaffinity(0, cpu_list(args.client_cpus))
    logs = Path(tempfile.mkdtemp(prefix="lt-compare-"))
    texts = heldout_texts("en", args.seed)
    result: dict[str, Any] = {
        "kind": "compare_libretranslate",
        "config": {
            "libretranslate": LT_VERSION,
            "server_cpus": args.server_cpus,
            "client_cpus": args.client_cpus,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "pairs": args.pairs,
            "inputs": f"{HELDOUT.name} en short, seed {args.seed}, {len(texts)} strings",
            "argos": {
                **{k: v for k, v in argos_env(args.lt_home).items() if k.startswith("ARGOS")},
                "ARGOS_BEAM_SIZE": os.environ.get("ARGOS_BEAM_SIZE", "4 (Argos' default)"),
            },
        },
        "machine": machine_facts(),
        "pairs": [],
    }
    ours_cmd, ours_env = our_command(free_port(), args.server_cpus)
    lt_cmd, lt_env = lt_command(free_port(), args.server_cpus, args.lt_venv, args.lt_home)
    with (
        started("mtserve", ours_cmd, ours_env, "/ready", logs / "ours.log") as ours,
        started("libretranslate", lt_cmd, lt_env, "/languages", logs / "lt.log") as lt,
    ):
        for server in (ours, lt):
            warm(server.url, args.seed)
            load(server.url, texts, args.concurrency, args.warmup)
        result["agreement"] = agreement(ours.url, lt.url, texts[:AGREEMENT_TEXTS])
        print(f"same output: {result['agreement']}", flush=True)
        for index in range(args.pairs):
            order = (ours, lt) if index % 2 == 0 else (lt, ours)
            cell: dict[str, Any] = {"order": [s.name for s in order]}
            for server in order:
                arm = "ours" if server is ours else "libretranslate"
                cell[arm] = load(server.url, texts, args.concurrency, args.duration)
                print(f"pair {index} {server.name}: {cell[arm]}", flush=True)
            result["pairs"].append(cell)
    result["summary"] = summarise(result["pairs"])
    if not args.skip_memory:
        result["memory"] = memory(args, logs)
    result["machine"]["load_average_end"] = list(os.getloadavg())
    return result


def memory(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Each server fresh: both directions, 50 requests, then its process tree's memory."""
    found: dict[str, Any] = {}
    texts = heldout_texts("en", args.seed + 1)
    arms = [
        ("mtserve single", *our_command(free_port(), args.server_cpus), "/ready"),
        ("mtserve multi", *our_command(free_port(), args.server_cpus), "/ready"),
        ("libretranslate", *lt_command(free_port(), args.server_cpus, args.lt_venv, args.lt_home), "/languages"),
    ]  # fmt: skip
    for name, command, env, ready in arms:
        if name.startswith("mtserve"):
            env = {**env, "MT_PROCESS_MODE": name.split()[1]}
            if name.endswith("multi"):
                # The mode a 2-CPU machine runs: its plan counts the CPUs it may use.
                command = ["taskset", "-c", args.memory_cpus, *command[3:]]
        log = logs / f"memory-{name.replace(' ', '-')}.log"
        with started(name, command, env, ready, log) as server:
            warm(server.url, args.seed)
            load(server.url, texts[:MEMORY_REQUESTS], 4, 0)
            time.sleep(1.0)
            found[name] = tree_memory(server.process.pid)
        print(f"memory {name}: {found[name]['rss_mb']} MB RSS, {found[name]['pss_mb']} MB PSS")
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.compare_libretranslate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lt-venv", type=Path, default=DEFAULT_LT_VENV)
    parser.add_argument("--lt-home", type=Path, default=DEFAULT_LT_HOME)
    commands = parser.add_subparsers(dest="command", required=True)
    packages = commands.add_parser("packages", help="build and install the Argos packages")
    packages.add_argument("--models", nargs="+", default=[f"models/{n}" for n in SHIPPED])
    go = commands.add_parser("run", help="the alternating closed-loop comparison and memory")
    go.add_argument("--pairs", type=int, default=4)
    go.add_argument("--duration", type=float, default=60.0, help="seconds per arm")
    go.add_argument("--warmup", type=float, default=10.0, help="closed-loop seconds first")
    go.add_argument("--concurrency", type=int, default=32)
    go.add_argument("--server-cpus", default="0")
    go.add_argument("--client-cpus", default="1")
    go.add_argument("--memory-cpus", default="0,1", help="CPUs of the multi-mode memory arm")
    go.add_argument("--seed", type=int, default=0)
    go.add_argument("--skip-memory", action="store_true")
    go.add_argument(
        "--output", type=Path, default=REPO_ROOT / "loadtest/results/compare_libretranslate.json"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.lt_venv, args.lt_home = args.lt_venv.resolve(), args.lt_home.resolve()
    if not (args.lt_venv / "bin" / "libretranslate").exists():
        raise SystemExit(
            f"no LibreTranslate in {args.lt_venv}: run loadtest/setup_libretranslate.sh"
        )
    if args.command == "packages":
        work = args.lt_home / "packages-built"
        models = [REPO_ROOT / m if not Path(m).is_absolute() else Path(m) for m in args.models]
        print(build_packages(models, args.lt_venv, args.lt_home, work))
        return 0
    result = run(args)
    print(json.dumps(result["summary"], indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
