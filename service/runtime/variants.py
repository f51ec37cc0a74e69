"""Which variant of an export a CPU engine opens: its int8 variant where the export's own
check says int8 holds, else the fp32 export itself.

An export may carry an int8 variant for CPU serving in ``<export>/int8`` (export/int8_check.py
writes it), and records in its config.json, under ``int8_check``, how it measured on held-out
pairs: chrF of both variants against references, how many strings int8 translates differently
alone than in batches (``batch_differences``), and ``holds`` when int8 is at most
``TOLERANCE_CHRF`` below fp32 and no string differs. On the CPU provider that variant serves
when the check holds (int8 MatMuls are 2-3x faster there and the kernels' rounding costs no
measured quality); on CUDA the fp32 (or fp16) export serves as it is, and the model setting
``cpu_int8`` off keeps fp32 everywhere. An export whose check predates the batch check (its
int8 quantized a whole batch's activations with one scale) keeps fp32.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from service.runtime.contract import CONFIG_FILE

log = logging.getLogger(__name__)

INT8_DIR = "int8"
INT8_CHECK_KEY = "int8_check"
TOLERANCE_CHRF = 0.3


def int8_check(model_dir: Path) -> dict[str, Any] | None:
    """The recorded int8 check of an export; None where it has none (or it cannot be read)."""
    try:
        check = json.loads((model_dir / CONFIG_FILE).read_text()).get(INT8_CHECK_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return check if isinstance(check, dict) else None


def int8_variant(model_dir: Path) -> Path | None:
    """The export's int8 variant when its recorded check holds, else None."""
    check = int8_check(model_dir)
    if check is None or check.get("holds") is not True:
        return None
    variant = model_dir / str(check.get("dir", INT8_DIR))
    if not (variant / CONFIG_FILE).is_file():
        return None
    delta = check.get("delta_chrf")
    if not isinstance(delta, int | float) or delta < -TOLERANCE_CHRF:
        return None  # a check recorded by hand, or against another tolerance
    differences = check.get("batch_differences")
    if type(differences) is not int or differences != 0:
        return None  # outputs that depend on the batch, or a check from before it was measured
    return variant


def served_variant(model_dir: str | Path, on_cpu: bool, cpu_int8: bool) -> Path:
    """The directory an engine opens for ``model_dir``: the int8 variant on the CPU when it
    holds and ``cpu_int8`` allows it, else ``model_dir``."""
    model_dir = Path(model_dir)
    if not (on_cpu and cpu_int8):
        return model_dir
    variant = int8_variant(model_dir)
    if variant is None:
        return model_dir
    check = int8_check(model_dir) or {}
    log.info(
        "%s: serving its int8 variant on the CPU (held-out chrF %s vs fp32 %s)",
        model_dir,
        check.get("chrf_int8"),
        check.get("chrf_fp32"),
    )
    return variant
