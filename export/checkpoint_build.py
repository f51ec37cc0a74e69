"""A served export from a downloaded checkpoint, in stages: import (models/marian.py,
models/m2m100.py), ONNX export (export/onnx_export.py), a parity check of greedy decodes
against PyTorch (export/verify.py), and the int8 or fp16 variant (export/variants.py); an fp32 build carries the int8 variant for
CPUs with its held-out check (export/int8_check.py).

``python -m service models pull`` calls :func:`build_from_checkpoint` after its download; the
torch side lives here, with the rest of the exporter, so that nothing under service/ imports
torch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from service.runtime.contract import Variant

# Source lengths of the parity check's sentences (random ids, as export/verify.py makes them).
PARITY_LENGTHS = [5, 9, 12, 7]
PARITY_MAX_NEW_TOKENS = 16


class BuildRefused(ValueError):
    """The checkpoint cannot be served: it does not import, or its export does not decode as
    the checkpoint does. The message is a sentence for the user."""


def stages_for(variant: Variant) -> list[str]:
    return ["import", "export", "parity", "int8" if variant == "fp32" else variant]


def build_from_checkpoint(
    checkpoint: Path,
    staging: Path,
    name: str,
    variant: Variant,
    pair: tuple[str, str] | None,
    stage: Callable[[str], AbstractContextManager[object]],
) -> Path:
    """The export of ``checkpoint`` as ``name``, written below ``staging``; its directory.
    ``stage(name)`` wraps each of :func:`stages_for`'s stages (a progress bar)."""
    from export.int8_check import add_cpu_int8
    from export.onnx_export import export_model
    from export.variants import make_fp16, make_int8
    from export.verify import decode_agreement
    from models.checkpoint import load_pretrained

    with stage("import"):
        try:
            model = load_pretrained(checkpoint)
        except (ValueError, KeyError) as error:
            raise BuildRefused(f"{name} cannot be imported: {error}") from error
    fp32 = staging / "fp32"
    with stage("export"):
        export_model(model, fp32, tokenizer_dir=checkpoint, model_name=name, languages=pair)
    with stage("parity"):
        agreement = decode_agreement(
            model, fp32, PARITY_LENGTHS, beam_sizes=(1,), max_new_tokens=PARITY_MAX_NEW_TOKENS
        )
        if agreement["beam1"] < 1.0:
            raise BuildRefused(
                f"the export of {name} does not decode as the checkpoint does "
                f"({agreement['beam1']:.0%} of {len(PARITY_LENGTHS)} greedy decodes identical); "
                "nothing was installed"
            )
    if variant == "int8":
        with stage("int8"):
            return make_int8(fp32, staging / "int8")
    if variant == "fp16":
        with stage("fp16"):
            return make_fp16(fp32, staging / "fp16")
    with stage("int8"):  # the variant CPUs serve where its held-out check holds
        add_cpu_int8(fp32)
    return fp32
