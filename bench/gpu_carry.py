"""Split what a GPU session needs into device calls that each fit the transfer limit.

    python bench/gpu_carry.py plan --out .carry FILE...     # here, before the session
    bash .carry/assemble.sh DEST                            # there, in the last call

A device call carries the working tree (tracked files and untracked files git does not ignore)
plus the folders named in ``carry``, 64 MiB in all; a warm machine keeps ignored folders between
calls. So a 256 MB wheel travels as parts spread over several calls, each call naming one folder
``.carry/call-NN``, and the last call joins the parts and checks their SHA-256. The per-call
budget is what the working tree leaves of the limit, measured here (``tree_bytes``).

The two shipped models' weights (44 MB) travel with every call and leave about 16 MB a call:
onnxruntime-gpu alone (256 MB) would take 16 calls. To carry them once instead, plan and call
from a throwaway branch that untracks them, and carry them as parts like the wheels::

    git switch -c gpu-carry && git rm -q --cached models/*/model.safetensors
    echo '/models/*/model.safetensors' >> .git/info/exclude && git commit -qm carry
    python bench/gpu_carry.py plan --out .carry WHEELS... models/*/model.safetensors

(the weights share a name: copy each to a name of its own first), then ``git switch main`` and
drop the exclude line after the session. ``plan`` prints what travels with every call.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

CALL_LIMIT_BYTES = 64 * 2**20
MARGIN_BYTES = 2**20
"""Left free in every call: the plan's own files and what the tree gains before the call."""
MAX_PART_BYTES = 60 * 10**6


def tree_bytes(repo: Path) -> int:
    """Bytes of what travels with every call: tracked files and untracked ones not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, capture_output=True, check=True,
    ).stdout  # fmt: skip
    paths = {name for name in listed.decode().split("\0") if name}
    return sum((repo / name).stat().st_size for name in paths if (repo / name).is_file())


def plan_calls(sizes: dict[str, int], budget: int, max_part: int = MAX_PART_BYTES) -> list[list]:
    """Each call's parts as ``[name, part number, offset, length]``, filled in order, every
    call at most ``budget`` bytes and every part at most ``max_part``."""
    if budget <= 0:
        raise ValueError("the working tree alone fills a call: nothing can be carried")
    calls: list[list] = [[]]
    room = budget
    for name, size in sizes.items():
        offset = number = 0
        while True:
            if room == 0:
                calls.append([])
                room = budget
            length = min(size - offset, room, max_part)
            calls[-1].append([name, number, offset, length])
            room, offset, number = room - length, offset + length, number + 1
            if offset >= size:
                break
    return calls


def write_plan(files: list[Path], out: Path, budget: int) -> dict[str, object]:
    """Write ``out/call-NN/<file>.part-NNN``, ``out/plan.json`` and ``out/assemble.sh``."""
    sizes = {path.name: path.stat().st_size for path in files}
    by_name = {path.name: path for path in files}
    calls = plan_calls(sizes, budget)
    ordered_parts: dict[str, list[str]] = {name: [] for name in sizes}
    for number, parts in enumerate(calls, start=1):
        folder = out / f"call-{number:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, part, offset, length in parts:
            with by_name[name].open("rb") as source:
                source.seek(offset)
                (folder / f"{name}.part-{part:03d}").write_bytes(source.read(length))
            ordered_parts[name].append(f"{folder.name}/{name}.part-{part:03d}")
    digests = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in files}
    plan: dict[str, object] = {"budget_bytes": budget, "calls": len(calls), "sha256": digests}
    (out / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    lines = [
        "#!/usr/bin/env bash",
        "# Join the carried parts into DEST and check them.",
        "set -euo pipefail",
        'here=$(cd "$(dirname "$0")" && pwd)',
        "dest=${1:?DEST}",
        'mkdir -p "$dest"',
    ]
    for name, digest in digests.items():
        parts = " ".join(f'"$here"/{shlex.quote(part)}' for part in ordered_parts[name])
        lines.append(f'cat {parts} > "$dest"/{shlex.quote(name)}')
        lines.append(f'echo "{digest}  $dest/{name}" | sha256sum -c --quiet')
    (out / "assemble.sh").write_text("\n".join(lines) + "\n")
    return plan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("verb", choices=["plan"])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(".carry"))
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument(
        "--call-limit-mib", type=float, default=CALL_LIMIT_BYTES / 2**20,
        help="what one call may carry, working tree included",
    )  # fmt: skip
    args = parser.parse_args(argv)
    tree = tree_bytes(args.repo)
    print(f"travelling with every call: {tree / 1e6:.1f} MB", file=sys.stderr)
    budget = int(args.call_limit_mib * 2**20) - tree - MARGIN_BYTES
    plan = write_plan(args.files, args.out, budget)
    print(json.dumps({"tree_bytes": tree, **plan}, indent=2), file=sys.stderr)
    print(f"{plan['calls']} calls: carry {args.out}/call-01 ... call-{plan['calls']:02d}, "
          f"the last one running bash {args.out}/assemble.sh .whl first")  # fmt: skip


if __name__ == "__main__":
    main()
