"""Resident memory of the server with the two shipped models, in each process mode.

    PYTHONPATH=$PWD .venv/bin/python bench/memory.py [--modes single multi] [--stages]

Each arm is measured as loadtest/compare_libretranslate.py's memory part measures it (the
same functions; that comparison also starts LibreTranslate): a fresh ``python -m service``
serving build/onnx/default and build/onnx/de-en as ``make serve`` does (``multi`` pinned to
two CPUs, the mode a 2-CPU machine's plan would pick with ``auto`` being ``single``), both
directions warmed, 50 held-out requests, then the RSS and PSS of its process tree.

``--stages``: where one process's memory goes, each stage in a fresh interpreter: the RSS
after the app's imports, after the language detector is built (and how long it took), after
both engines (their int8 variants, as served on a CPU) are loaded, and after their warm-up.
Writes JSON to bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from loadtest.compare_libretranslate import (  # noqa: E402
    MEMORY_REQUESTS,
    SHIPPED,
    free_port,
    heldout_texts,
    load,
    our_command,
    started,
    tree_memory,
    warm,
)

RESULTS = REPO_ROOT / "bench" / "results" / "memory.json"

# One interpreter per stage: each prints its RSS (MB) after the stages up to its own.
STAGES = """
import sys, time
from pathlib import Path
stage = sys.argv[1]
def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
import service.wiring, service.__main__  # noqa: F401 - what serving imports
if stage == "imports":
    print(rss()); sys.exit()
if stage == "detector":
    from service.translation.detection import LanguageDetector
    started = time.perf_counter()
    LanguageDetector(["en", "de"]).detect("Toggle Sort Order")
    print(rss(), time.perf_counter() - started); sys.exit()
from service.runtime.engine import Engine
from service.runtime.variants import int8_variant
engines = [
    Engine.from_dir(int8_variant(Path(path)) or path, provider="cpu", intra_op_threads=1)
    for path in sys.argv[2:]
]
if stage == "engines":
    print(rss()); sys.exit()
for engine in engines:
    engine.warmup()
print(rss())
"""


def stages(exports: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for stage in ("imports", "detector", "engines", "engines run"):
        output = subprocess.run(
            [sys.executable, "-c", STAGES, stage.replace("engines run", "run"), *exports],
            cwd=REPO_ROOT,
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        found[stage] = {"rss_mb": round(float(output[0]), 1)}
        if len(output) > 1:
            found[stage]["build_s"] = round(float(output[1]), 2)
        print(f"stage {stage}: {found[stage]}", flush=True)
    return found


def served(mode: str, logs: Path, seed: int) -> dict[str, Any]:
    command, env = our_command(free_port(), "0" if mode == "single" else "0,1")
    env = {**env, "MT_PROCESS_MODE": mode}
    with started(f"mtserve {mode}", command, env, "/ready", logs / f"memory-{mode}.log") as server:
        warm(server.url, seed)
        load(server.url, heldout_texts("en", seed + 1)[:MEMORY_REQUESTS], 4, 0)
        time.sleep(1.0)
        found = tree_memory(server.process.pid)
    print(f"{mode}: {found['rss_mb']} MB RSS, {found['pss_mb']} MB PSS", flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="*", default=["single", "multi"])
    parser.add_argument("--stages", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import tempfile

    logs = Path(tempfile.mkdtemp(prefix="memory-"))
    result: dict[str, Any] = {"kind": "memory", "models": list(SHIPPED)}
    if args.stages:
        exports = [str(REPO_ROOT / "build" / "onnx" / name) for name in SHIPPED]
        result["stages"] = stages(exports)
    result["served"] = {mode: served(mode, logs, args.seed) for mode in args.modes}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
