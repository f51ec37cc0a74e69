"""The verbs of ``python -m service``: one help that lists them, and the dispatch of those that
are not the server (service/__main__.py parses the server's own flags)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

DESCRIPTION = "Machine translation: serve the HTTP APIs, manage models, translate files."

# (verb, what it does): what `python -m service --help` lists.
VERBS = (
    ("serve", "serve the HTTP APIs (the default verb: `python -m service --port 9000`)"),
    (
        "models",
        "pull, sync, list, update and remove models by name: `models pull opus-mt-en-fr` "
        "(`make pull MODEL=...` runs it), `models list` (`models --help`)",
    ),
    (
        "translate",
        "translate text or files without a server: "
        "`translate --source en --target de [FILE ...]` (`translate --help`)",
    ),
)

USAGE = (
    "python -m service [serve] [--host HOST] [--port PORT] [--model-dir DIR] "
    "[--log-level LEVEL]\n"
    "       python -m service models {pull,sync,list,update,remove} ...\n"
    "       python -m service translate --source SRC --target TGT [FILE ...]"
)


def epilog() -> str:
    width = max(len(verb) for verb, _ in VERBS)
    indent = " " * (width + 4)
    lines = [
        textwrap.fill(f"  {verb:<{width}}  {about}", 88, subsequent_indent=indent)
        for verb, about in VERBS
    ]
    return "commands:\n" + "\n".join(lines)


def run_verb(argv: Sequence[str]) -> int | None:
    """The exit status of a verb other than ``serve``; None when ``argv`` serves."""
    verb = argv[0] if argv else ""
    if verb == "models":  # python -m service models pull|list|update|remove
        from service.models_cli import main as models_main

        return models_main(argv[1:])
    if verb == "translate":
        from service.batch.cli import main as translate_main

        return translate_main(argv[1:])
    return None


def serve_argv(argv: Sequence[str]) -> list[str]:
    """The server's flags: ``argv`` without the ``serve`` verb, which may be left out."""
    return list(argv[1:]) if argv[:1] == ["serve"] else list(argv)
