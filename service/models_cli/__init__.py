"""``python -m service models pull|list|update|remove``: translation models by name, as
LibreTranslate's ``argospm`` and ``huggingface-cli`` manage theirs.

Models install into ``MT_MODELS_DIR`` (unset: ``MT_DATA_DIR/models``, so ``data/models`` by
default), which the service serves when ``MT_MODELS_DIR`` points there (``make serve`` does).
Downloads go through the Hugging Face cache (``HF_HOME``), so ``HF_HUB_OFFLINE=1`` pulls from
what is cached. Failures print one sentence and exit non-zero, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from service.config import Settings, get_settings
from service.models_cli.catalog import known_names
from service.models_cli.errors import ModelsError
from service.models_cli.hub import Downloader, HubDownloader
from service.models_cli.pull import Puller, describe_languages
from service.models_cli.startup import default_models_dir, pull_missing
from service.models_cli.store import InstalledModel, ModelStore
from service.runtime.contract import Variant


def parser(settings: Settings) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m service models",
        description="Pull, list, update and remove translation models.",
        epilog=known_names(),
    )
    top.add_argument(
        "--models-dir",
        type=Path,
        default=default_models_dir(settings),
        help="where models are installed (MT_MODELS_DIR, else MT_DATA_DIR/models; "
        "default %(default)s)",
    )
    commands = top.add_subparsers(dest="command", required=True)
    pull = commands.add_parser("pull", help="download, export, verify and install a model")
    pull.add_argument("name", help="opus-mt-SRC-TGT, nllb-200-distilled-600M, ... or ORG/NAME")
    pull.add_argument("--revision", help="a branch, tag or commit of the Hub repository")
    variant = pull.add_mutually_exclusive_group()
    variant.add_argument("--int8", action="store_true", help="install the int8 variant (CPU)")
    variant.add_argument("--fp16", action="store_true", help="install the fp16 variant (CUDA)")
    commands.add_parser(
        "sync", help="pull every MT_MODELS model that is not installed (what start-up does)"
    )
    commands.add_parser("list", help="the installed models")
    update = commands.add_parser("update", help="re-pull models whose Hub revision moved")
    update.add_argument("name", nargs="?", help="one installed model (default: all)")
    remove = commands.add_parser("remove", help="delete an installed model")
    remove.add_argument("name")
    return top


def main(argv: Sequence[str] | None = None, downloader: Downloader | None = None) -> int:
    settings = get_settings()
    args = parser(settings).parse_args(argv)
    debug = settings.process.log_level.lower() == "debug"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(message)s")
    if not debug:  # the ONNX exporter's notes on optional operators, around the progress bar
        logging.getLogger("torch").setLevel(logging.ERROR)
    store = ModelStore(args.models_dir)
    puller = Puller(store, downloader or HubDownloader())
    try:
        if args.command == "pull":
            variant: Variant = "int8" if args.int8 else "fp16" if args.fp16 else "fp32"
            puller.pull(args.name, args.revision, variant)
        elif args.command == "sync":
            settings = settings.replace(models_dir=args.models_dir)
            pulled = pull_missing(settings, puller.downloader, print)
            print(f"pulled {', '.join(pulled)}" if pulled else "nothing to pull")
        elif args.command == "list":
            print(table(store.installed()) if store.installed() else f"no models in {store.root}")
        elif args.command == "update":
            puller.update(args.name)
        elif args.command == "remove":
            store.remove(args.name)
            print(f"removed {args.name}")
    except ModelsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing was installed", file=sys.stderr)
        return 130
    except Exception as error:  # a sentence, not a traceback; debug logging shows it
        logging.getLogger(__name__).debug("%s failed", args.command, exc_info=True)
        print(
            f"error: {args.command} failed: {type(error).__name__}: {error} "
            "(MT_LOG_LEVEL=debug shows where)",
            file=sys.stderr,
        )
        return 1
    return 0


def table(models: list[InstalledModel]) -> str:
    rows = [("NAME", "LANGUAGES", "VARIANT", "SIZE", "REVISION", "SOURCE")]
    for model in models:
        held = model.manifest
        rows.append(
            (
                model.name,
                describe_languages(model.languages),
                model.variant,
                f"{model.size_bytes / 1e6:.1f} MB",
                held.revision[:12] if held else "-",
                held.hub_id if held else "local export",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
