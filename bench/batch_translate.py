"""Batch translation's throughput (``python -m service translate``) beside the server's, on
one large text file.

    .venv/bin/python bench/batch_translate.py [--input FILE] [--lines 20000]
        [--model build/onnx/default] [--source en] [--target de] [--clients 8]
        [--output bench/results]

The text: ``--input`` (one text per line), else ``--lines`` lines of the held-out English
help texts (bench/heldout, the long ones, repeated in order). Every run translates the same
file with the same export (``--model``), every sentence decoded (the server's translation
cache is off by default, and the command has none):

1. **command**: ``python -m service translate --model-dir MODEL FILE -o OUT``, wall time from
   the start of the process; its start-up (loading, warming and calibrating the model) is
   the same command on a one-line file, and the translation alone is the difference;
2. **server, /translate_file**: the service started as ``make serve`` starts it (its own
   process mode), the file uploaded in one ``POST /translate_file`` and downloaded;
3. **server, /translate**: ``--clients`` clients, each sending the next 64 lines
   (``MT_MAX_TEXTS_PER_REQUEST``) as soon as its last request is answered, until the file is
   done (what a script over the HTTP API does).

Prints a table (lines/s, characters/s, seconds) and writes JSON with the machine's facts to
``--output``/batch_translate.json; ``same_output`` says whether the command's file and the
server's are the same text (the same models and text handling). Run it alone on the machine
(``flock -x /tmp/cpu.lock`` on shared ones): it measures wall time. ``--lines 20`` checks
that it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.client import spawned_server  # noqa: E402
from loadtest.machine import machine_facts  # noqa: E402

HELDOUT = ROOT / "bench" / "heldout" / "ui_strings_en_de.json"
REQUEST_TEXTS = 64  # MT_MAX_TEXTS_PER_REQUEST's default


def heldout_lines(count: int, language: str) -> list[str]:
    """``count`` lines of the held-out long strings of ``language``, repeated in order."""
    data = json.loads(HELDOUT.read_text(encoding="utf-8"))
    texts = [t for found in data["strings"].values() for t in found[language]["long"]]
    return [texts[index % len(texts)] for index in range(count)]


def command_run(model: Path, source: str, target: str, path: Path, out: Path) -> float:
    """Seconds of ``python -m service translate`` over ``path``, from the process's start."""
    argv = [sys.executable, "-m", "service", "translate", "--no-progress"]
    argv += ["-s", source, "-t", target, "--model-dir", str(model), str(path), "-o", str(out)]
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def server_file(url: str, source: str, target: str, path: Path) -> tuple[float, bytes]:
    """Seconds of one ``POST /translate_file`` and its download; the translated file."""
    with httpx.Client(timeout=None, trust_env=False) as client:
        started = time.perf_counter()
        response = client.post(
            url + "/translate_file",
            data={"source": source, "target": target},
            files={"file": (path.name, path.read_bytes(), "text/plain")},
        )
        response.raise_for_status()
        download = client.get(response.json()["translatedFileUrl"])
        download.raise_for_status()
        return time.perf_counter() - started, download.content


async def server_requests(
    url: str, source: str, target: str, lines: list[str], clients: int
) -> float:
    """Seconds for ``clients`` closed-loop clients to translate ``lines`` by /translate."""
    chunks = [lines[start : start + REQUEST_TEXTS] for start in range(0, len(lines), REQUEST_TEXTS)]
    queue = list(reversed(chunks))

    async def client_loop(client: httpx.AsyncClient) -> None:
        while queue:
            chunk = queue.pop()
            body = {"q": chunk, "source": source, "target": target}
            response = await client.post(url + "/translate", json=body)
            response.raise_for_status()

    async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return time.perf_counter() - started


def row(name: str, seconds: float, lines: int, chars: int) -> dict:
    return {
        "run": name,
        "seconds": round(seconds, 2),
        "lines_per_s": round(lines / seconds, 1) if seconds > 0 else None,
        "chars_per_s": round(chars / seconds) if seconds > 0 else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, help="a text file, one text per line")
    parser.add_argument("--lines", type=int, default=20_000, help="lines without --input")
    parser.add_argument("--model", type=Path, default=Path("build/onnx/default"))
    parser.add_argument("--source", default="en")
    parser.add_argument("--target", default="de")
    parser.add_argument("--clients", type=int, default=8, help="/translate clients")
    parser.add_argument("--output", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    model = (ROOT / args.model).resolve()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        path = work / "input.txt"
        if args.input is not None:
            path.write_bytes(args.input.read_bytes())
        else:
            path.write_text("\n".join(heldout_lines(args.lines, args.source)) + "\n")
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        chars = sum(map(len, lines))
        one = work / "one.txt"
        one.write_text(lines[0] + "\n")
        print(f"{len(lines)} lines, {chars} characters; {args.model}", file=sys.stderr)

        startup = command_run(model, args.source, args.target, one, work / "one.out.txt")
        command_out = work / "command.out.txt"
        command = command_run(model, args.source, args.target, path, command_out)
        results = [
            row("command, wall (start-up included)", command, len(lines), chars),
            row("command, translation (wall - start-up)", command - startup, len(lines), chars),
        ]
        with spawned_server(model) as url:
            file_seconds, served = server_file(url, args.source, args.target, path)
            results.append(row("server, POST /translate_file", file_seconds, len(lines), chars))
            seconds = asyncio.run(
                server_requests(url, args.source, args.target, lines, args.clients)
            )
            results.append(
                row(f"server, /translate x {args.clients} clients", seconds, len(lines), chars)
            )
        same = command_out.read_bytes() == served
    report = {
        "lines": len(lines),
        "characters": chars,
        "model": str(args.model),
        "pair": f"{args.source}-{args.target}",
        "command_startup_s": round(startup, 2),
        "same_output": same,
        "results": results,
        "machine": machine_facts(),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "batch_translate.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'run':<42} {'seconds':>9} {'lines/s':>9} {'chars/s':>9}")
    for result in results:
        print(
            f"{result['run']:<42} {result['seconds']:>9} {result['lines_per_s']:>9} "
            f"{result['chars_per_s']:>9}"
        )
    print(f"command start-up {startup:.1f} s; same output as the server: {same}")


if __name__ == "__main__":
    main()
