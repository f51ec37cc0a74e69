"""``python -m loadtest {open,closed,sweep,compare,scaling,stub,...} [options]``: one entry point for the scripts.

Each subcommand is also runnable on its own (``python -m loadtest.open_loop`` ...); ``--help``
on any of them lists its options. See loadtest/README.md.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from loadtest.client import exit_on_sigterm

COMMANDS: dict[str, tuple[str, str]] = {
    "open": (
        "loadtest.open_loop",
        "open-loop Poisson arrivals at --rate (latency under a given load)",
    ),
    "closed": (
        "loadtest.closed_loop",
        "--concurrency clients back to back (throughput at a concurrency)",
    ),
    "sweep": (
        "loadtest.sweep",
        "raise the open-loop rate until p99 > --slo-p99-ms; highest sustainable rate",
    ),
    "compare": (
        "loadtest.compare_batching",
        "the same open-loop load against MT_BATCHING=continuous, then static; side by side",
    ),
    "overload": (
        "loadtest.overload",
        "open loop at --factor x measured capacity: shedding, probes, memory, CPU split",
    ),
    "soak": (
        "loadtest.soak",
        "a long open-loop run at --fraction x --capacity: errors, RSS growth, open fds",
    ),
    "faults": (
        "loadtest.faults",
        "engine error in one step, dead engine thread, SIGTERM: each under load",
    ),
    "scaling": (
        "loadtest.scaling",
        "per machine shape: plan, capacity, p50/p99 at 50/85/95 %, CPU-s per request by process",
    ),
    "stub": ("loadtest.stub_server", "a stand-in service for trying the tools without a model"),
}


def usage() -> str:
    lines = ["usage: python -m loadtest {" + ",".join(COMMANDS) + "} [options]", ""]
    lines += [f"  {name:<7} {description}" for name, (_, description) in COMMANDS.items()]
    lines += ["", "Locust: .venv/bin/locust -f loadtest/locustfile.py (see loadtest/README.md)"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        print(usage(), file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
        return 0 if not args or args[0] in ("-h", "--help") else 2
    module_name = COMMANDS[args[0]][0]
    exit_on_sigterm()  # spawned servers are stopped however the run ends
    module = importlib.import_module(module_name)
    entry: Callable[[Sequence[str]], int] = module.main
    return entry(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
