"""``python -m service translate --source en --target de [FILE ...]``: translate text or files
in this process, without a server (service/batch/__init__.py).

With no FILE (or ``-``), standard input is read as text (one text per line, as a ``.txt``
file; ``--format`` names another format) and the translation goes to standard output. Each
FILE is translated by its extension (the server's ``/translate_file`` formats: .txt, .po/.pot,
.srt, .html, .md, .xlf, .docx, .pptx, .xlsx, .odt, .odp, .ods, .epub) and written beside it as
``NAME.TARGET.EXT`` (``guide.md`` → ``guide.de.md``; a ``.pot`` becomes a ``.po``), or where
``--output`` says. A progress bar goes to stderr when a translation takes more than a few
seconds on a terminal.

Exit status: 0 when everything was translated; 2 for a bad command line: an unknown
language, a pair no model serves, a file that is missing or of another format; 1 when a
translation failed (a sentence over the model's length, a file its format's library cannot
read, no models installed).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path, PurePath

from service.batch import BatchTranslator
from service.config import get_settings
from service.errors import ServiceError, UnsupportedFile, UnsupportedLanguage
from service.text.files import SUPPORTED_EXTENSIONS
from service.translation.discovery import RegistryError

USAGE_ERROR = 2
FAILED = 1


def parser() -> argparse.ArgumentParser:
    formats = " ".join(extension.lstrip(".") for extension in SUPPORTED_EXTENSIONS)
    command = argparse.ArgumentParser(
        prog="python -m service translate",
        description="Translate text or files with the installed models, without a server.",
        epilog=f"formats: {formats}. Models: MT_EXPORTS / MT_MODELS_DIR as for the server; "
        "by default the shipped exports (build/onnx) and the pulled models. "
        "docs/batch.md has the details.",
    )
    command.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="files to translate, each written beside it as NAME.TARGET.EXT unless --output "
        "says otherwise (none, or -: standard input to standard output)",
    )
    command.add_argument("-s", "--source", required=True, help="source language (en, de, ...)")
    command.add_argument("-t", "--target", required=True, help="target language")
    command.add_argument(
        "-o",
        "--output",
        type=Path,
        help="with one FILE: the file to write (- : stdout); with several: a directory",
    )
    command.add_argument(
        "--format",
        help="the format of standard input, as an extension (txt, po, srt, html, md ...; "
        "default txt)",
    )
    command.add_argument("--beam-size", type=int, help="beam size (MT_DEFAULT_BEAM_SIZE)")
    command.add_argument(
        "--model-dir",
        type=Path,
        action="append",
        default=[],
        help="translate with this export (repeatable; instead of the configured models)",
    )
    progress = command.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        help="always show the progress bar (default: when stderr is a terminal)",
    )
    progress.add_argument(
        "--no-progress", dest="progress", action="store_const", const=False, help="never show it"
    )
    return command


def output_name(source: PurePath, translated_name: str, target: str) -> str:
    """``guide.md`` → ``guide.de.md`` (the translated file's own name, a ``.pot`` made ``.po``,
    with the target's code before its extension)."""
    name = PurePath(translated_name)
    return f"{name.stem}.{target}{name.suffix}" if name.suffix else f"{source.name}.{target}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = get_settings()
    debug = settings.process.log_level.lower() == "debug"
    # The engine's start-up notes stay out of the way of the output and the bar.
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(message)s")
    files = args.files or ["-"]
    if args.format and any(name != "-" for name in files):
        return _usage("--format is for standard input; files are read by their extension")
    stdin_name = f"stdin.{(args.format or 'txt').lstrip('.')}"
    if PurePath(stdin_name).suffix.lower() not in SUPPORTED_EXTENSIONS:
        return _usage(f"format {args.format!r} is not supported")
    for name in files:
        if name != "-" and not Path(name).is_file():
            return _usage(f"{name}: no such file")
        if name != "-" and PurePath(name).suffix.lower() not in SUPPORTED_EXTENSIONS:
            return _usage(f"{name}: format not supported ({PurePath(name).suffix or 'none'})")
    if len(files) > 1 and args.output is not None and args.output.is_file():
        return _usage(f"--output {args.output}: several files need a directory")
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        translator = BatchTranslator(settings, exports=args.model_dir)
    except RegistryError as error:
        print(f"error: no models to translate with: {error}", file=sys.stderr)
        return FAILED
    with translator:
        try:
            translator.route(args.source, args.target)  # an unserved pair before any work
            for name in files:
                _translate_one(translator, name, stdin_name, args, progress, len(files) > 1)
        except UnsupportedLanguage as error:
            return _usage(error.message)
        except UnsupportedFile as error:
            print(f"error: {error}", file=sys.stderr)
            return FAILED
        except ServiceError as error:
            print(f"error: {error.message}", file=sys.stderr)
            return FAILED
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except Exception as error:  # a sentence, not a traceback; debug logging shows where
            logging.getLogger(__name__).debug("translate failed", exc_info=True)
            print(
                f"error: {type(error).__name__}: {error} (MT_LOG_LEVEL=debug shows where)",
                file=sys.stderr,
            )
            return FAILED
    return 0


def _translate_one(
    translator: BatchTranslator,
    name: str,
    stdin_name: str,
    args: argparse.Namespace,
    progress: bool,
    several: bool,
) -> None:
    reading_stdin = name == "-"
    content = sys.stdin.buffer.read() if reading_stdin else Path(name).read_bytes()
    filename = stdin_name if reading_stdin else name
    translated = translator.translate_file(
        filename,
        args.source,
        args.target,
        content,
        beam_size=args.beam_size,
        progress=progress,
    )
    route = translator.route(args.source, args.target)
    output: Path | None = args.output
    if (reading_stdin and output is None) or output == Path("-"):
        sys.stdout.buffer.write(translated.content)
        sys.stdout.buffer.flush()
        return
    written = output_name(PurePath(filename), translated.filename, route.target)
    if output is None:
        destination = Path(name).with_name(written)
    elif several or output.is_dir():
        output.mkdir(parents=True, exist_ok=True)
        destination = output / (PurePath(translated.filename).name)
    else:
        destination = output
    destination.write_bytes(translated.content)
    print(f"{name} → {destination}", file=sys.stderr)


def _usage(message: str) -> int:
    print(f"python -m service translate: error: {message}", file=sys.stderr)
    return USAGE_ERROR
