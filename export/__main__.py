"""``python -m export --model DIR --output DIR [--int8] [--fp16] [--opset N] [--verify]``

Writes the fp32 export to OUTPUT and each requested variant to a sibling dir with the same
file names (``OUTPUT-int8``, ``OUTPUT-fp16``), so any of them can be served by pointing
``MT_EXPORTS`` at it. Unless ``--no-cpu-int8``, OUTPUT also carries the int8 variant for CPU
serving (``OUTPUT/int8``) with its chrF on held-out strings against fp32's
(export/int8_check.py): a CPU engine opens it where that check holds.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

from export.onnx_export import DEFAULT_OPSET, export_model
from export.variants import DEFAULT_INT8_MODE, INT8_MODES, PER_ROW_MODE, make_fp16, make_int8


def unreadable_model(model: Path) -> str | None:
    """Why ``--model`` is not a checkpoint directory, in a sentence; None when it is one."""
    if (model / "config.json").is_file():
        return None
    if model.is_dir():
        return f"{model} has no config.json: not a checkpoint directory"
    hint = ""
    if len(model.parts) == 2:  # ORG/NAME: a Hugging Face Hub id
        hint = f"; to download it from the Hugging Face Hub: python -m service models pull {model}"
    return f"no model directory at {model}{hint}"


def format_check(check: dict) -> str:
    if not check.get("pairs"):
        return f"not measured ({check.get('why')}); CPUs serve fp32"
    verdict = "CPUs serve int8" if check["holds"] else "CPUs serve fp32"
    return (
        f"chrF int8 {check['chrf_int8']} vs fp32 {check['chrf_fp32']} on {check['pairs']} "
        f"held-out pairs ({check['identical']:.0%} identical), "
        f"{check.get('batch_differences', '?')} strings differ alone and batched: {verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path, help="our model dir or a Marian dir")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="20 (default) or 23")
    parser.add_argument("--int8", action="store_true", help="also write OUTPUT-int8 (CPU)")
    parser.add_argument(
        "--int8-mode", choices=sorted([*INT8_MODES, PER_ROW_MODE]), default=DEFAULT_INT8_MODE
    )
    parser.add_argument("--fp16", action="store_true", help="also write OUTPUT-fp16 (CUDA)")
    parser.add_argument(
        "--no-vocab-screen",
        action="store_true",
        help="no int8 screen of greedy steps in the fp32 decoder (export/vocab_screen.py)",
    )
    parser.add_argument(
        "--no-cpu-int8",
        action="store_true",
        help="no OUTPUT/int8 variant and held-out check (export/int8_check.py)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="run export.verify on the fp32 export"
    )
    parser.add_argument(
        "--languages",
        nargs=2,
        metavar=("SOURCE", "TARGET"),
        help="language pair written to config.json (default: the tokenizer config's)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    warnings.filterwarnings("ignore")  # the dynamo exporter's axis-renaming chatter

    if (problem := unreadable_model(args.model)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from models.checkpoint import load_pretrained

    stages = 2 + (not args.no_cpu_int8) + args.int8 + args.fp16 + args.verify
    progress = iter(range(1, stages + 1))
    print(f"[{next(progress)}/{stages}] importing {args.model}", flush=True)
    started = time.perf_counter()
    try:
        model = load_pretrained(args.model)
    except (OSError, ValueError, KeyError) as error:  # a missing weights file, a foreign model
        print(f"error: {args.model} cannot be imported: {error}", file=sys.stderr)
        return 2
    print(
        f"[{next(progress)}/{stages}] exporting to {args.output} (opset {args.opset})", flush=True
    )
    export_model(
        model,
        args.output,
        args.opset,
        tokenizer_dir=args.model,
        model_name=args.model.name,
        languages=tuple(args.languages) if args.languages else None,
        vocab_screen=not args.no_vocab_screen,
    )
    print(f"wrote {args.output} (opset {args.opset}) in {time.perf_counter() - started:.1f} s")
    if not args.no_cpu_int8:
        print(f"[{next(progress)}/{stages}] the int8 variant for CPUs and its check", flush=True)
        from export.int8_check import add_cpu_int8

        check = add_cpu_int8(args.output)
        print(f"int8 check: {format_check(check)}")
    if args.int8:
        print(f"[{next(progress)}/{stages}] writing the int8 variant", flush=True)
        path = make_int8(args.output, Path(f"{args.output}-int8"), args.int8_mode)
        print(f"wrote {path}")
    if args.fp16:
        print(f"[{next(progress)}/{stages}] writing the fp16 variant", flush=True)
        path = make_fp16(args.output, Path(f"{args.output}-fp16"))
        print(f"wrote {path}")
    if args.verify:
        print(f"[{next(progress)}/{stages}] verifying against PyTorch", flush=True)
        from export.verify import verify

        report = verify(model, args.output)
        print(
            f"verify: ok={report.ok} max error={max(report.errors.values()):.2e} decodes={report.decodes}"
        )
        return 0 if report.ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
