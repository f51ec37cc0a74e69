"""The int8 variant an fp32 export carries for CPU serving, and its measured quality.

``add_cpu_int8(fp32_dir)`` writes ``<fp32_dir>/int8`` (export/variants.py's ``make_int8``: a
complete export with the same file names, inside the fp32 one so that it travels with it when
``models pull`` installs it) and measures it: both variants translate the held-out pairs of
their language pair (bench/heldout/ui_pairs_en_de.json: interface strings of catalogs the
shipped models never saw; English→German or German→English), greedy, masked and restored as
the service masks placeholders, and sacrebleu's chrF of each against the references is
recorded, with the share of outputs identical, in both configs: ``int8_check`` in the fp32
export's config.json (what serving reads, service/runtime/variants.py) and ``quality_check``
in the int8 one. int8 also translates every held-out string alone, and ``batch_differences``
counts the strings whose output differs from its output in the length-sorted batches: a
translation must not depend on what shares its batch. ``holds``: int8's chrF is at most
``TOLERANCE_CHRF`` below fp32's and no string differs.

A pair without held-out references (any but en→de and de→en) gets the int8 variant and a
check that says so (``holds`` false): serving then keeps fp32.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from service.runtime.contract import CONFIG_FILE
from service.runtime.variants import INT8_CHECK_KEY, INT8_DIR, TOLERANCE_CHRF

log = logging.getLogger(__name__)

PAIRS_FILE = Path(__file__).resolve().parents[1] / "bench" / "heldout" / "ui_pairs_en_de.json"
DEFAULT_LIMIT = 600  # pairs per check: chrF settles to ~0.1; 2.5-3.5 minutes on two loaded cores
BATCH = 32
MAX_NEW_TOKENS = 128


def heldout_pairs(
    source_lang: str, target_lang: str, limit: int = DEFAULT_LIMIT, path: Path = PAIRS_FILE
) -> list[tuple[str, str]]:
    """(source, reference) pairs of the held-out catalogs in this direction, ``limit`` of them
    spread evenly over the file (short strings and help texts alike); [] when the file has no
    such pairs or is absent."""
    sides = {"en": 0, "de": 1}
    if source_lang not in sides or target_lang not in sides or source_lang == target_lang:
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        return []
    pairs = [
        (pair[sides[source_lang]], pair[sides[target_lang]])
        for parts in data["pairs"].values()
        for kind in ("short", "long")
        for pair in parts.get(kind, [])
    ]
    if 0 < limit < len(pairs):
        step = len(pairs) / limit
        pairs = [pairs[int(i * step)] for i in range(limit)]
    return pairs


def translate(export_dir: Path, texts: list[str], batch: int = BATCH) -> list[str]:
    """Greedy translations by the serving engine on the CPU in length-sorted batches of
    ``batch`` (1: one string at a time), placeholders masked and put back as the service
    does."""
    from service.runtime.engine import Engine
    from service.text.protection import RunProtector, restore_every_run
    from service.text.tokenizer import Tokenizer

    engine = Engine.from_dir(export_dir, provider="cpu")
    tokenizer = Tokenizer.from_dir(export_dir)
    protector = RunProtector(tokenizer)
    masked = [protector.protect(text) for text in texts]
    sources = tokenizer.encode([text for text, _ in masked])
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # length-sorted batches
    outputs: list[str] = [""] * len(texts)
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        ids = engine.translate_ids([sources[i] for i in rows], max_new_tokens=MAX_NEW_TOKENS)
        for row, out in zip(rows, ids, strict=True):
            source_text, originals = masked[row]
            outputs[row] = restore_every_run(tokenizer.decode(out), originals, source_text)
    return outputs


def export_pairs(fp32_dir: Path, limit: int = DEFAULT_LIMIT) -> list[tuple[str, str]]:
    """The held-out pairs of the export's direction ([] for a multilingual model)."""
    config = json.loads((fp32_dir / CONFIG_FILE).read_text())
    if config.get("languages"):
        return []
    return heldout_pairs(config.get("source_lang", ""), config.get("target_lang", ""), limit)


def measure(fp32_dir: Path, int8_dir: Path, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """chrF of both variants on held-out ``pairs`` against their references, and how many of
    int8's outputs change when each string is translated alone."""
    import sacrebleu

    config = json.loads((fp32_dir / CONFIG_FILE).read_text())
    source, target = config.get("source_lang", ""), config.get("target_lang", "")

    started = time.perf_counter()
    texts, references = [s for s, _ in pairs], [r for _, r in pairs]
    fp32 = translate(fp32_dir, texts)
    int8 = translate(int8_dir, texts)
    alone = translate(int8_dir, texts, batch=1)
    batch_differences = sum(a != b for a, b in zip(int8, alone, strict=True))
    chrf_fp32 = sacrebleu.corpus_chrf(fp32, [references]).score
    chrf_int8 = sacrebleu.corpus_chrf(int8, [references]).score
    delta = chrf_int8 - chrf_fp32
    return {
        "pairs": len(pairs),
        "direction": f"{source}→{target}",
        "data": "bench/heldout/ui_pairs_en_de.json",
        "decoding": "greedy",
        "chrf_fp32": round(chrf_fp32, 2),
        "chrf_int8": round(chrf_int8, 2),
        "delta_chrf": round(delta, 2),
        "identical": round(sum(a == b for a, b in zip(fp32, int8, strict=True)) / len(pairs), 4),
        "tolerance_chrf": TOLERANCE_CHRF,
        "batch": BATCH,
        "batch_differences": batch_differences,
        "holds": delta >= -TOLERANCE_CHRF and batch_differences == 0,
        "cpu_flags": cpu_flags(),
        "seconds": round(time.perf_counter() - started, 1),
    }


def cpu_flags() -> list[str]:
    """The flags that decide the int8 kernels ONNX Runtime dispatches (AVX2 u8s8 with 7-bit
    weights, or VNNI/AMX): the check holds for the kind of CPU it ran on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
                return [flag for flag in line.split(":", 1)[1].split() if flag in wanted]
    except OSError:
        pass
    return []


def add_cpu_int8(fp32_dir: str | Path, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Write ``<fp32_dir>/int8``, measure it against fp32 and record the check in both
    configs; returns the check."""
    from export.variants import make_int8

    fp32_dir = Path(fp32_dir)
    pairs = export_pairs(fp32_dir, limit)
    if not pairs:  # nothing to measure it on: no variant, and CPUs serve fp32
        check: dict[str, Any] = {"pairs": 0, "holds": False, "why": "no held-out pairs"}
        _record(fp32_dir / CONFIG_FILE, INT8_CHECK_KEY, check)
        return check
    quantizer_log = logging.getLogger()  # ORT's quantizer logs every tensor on the root logger
    level = quantizer_log.level
    quantizer_log.setLevel(logging.ERROR)
    try:
        int8_dir = make_int8(fp32_dir, fp32_dir / INT8_DIR)
    finally:
        quantizer_log.setLevel(level)
    check = measure(fp32_dir, int8_dir, pairs)
    _record(fp32_dir / CONFIG_FILE, INT8_CHECK_KEY, {**check, "dir": INT8_DIR})
    _record(int8_dir / CONFIG_FILE, "quality_check", check)
    log.info("int8 check of %s: %s", fp32_dir, check)
    return check


def _record(path: Path, key: str, check: dict[str, Any]) -> None:
    config = json.loads(path.read_text())
    config.pop(INT8_CHECK_KEY, None)  # the int8 copy of the fp32 config had the last one
    config[key] = check
    path.write_text(json.dumps(config, indent=2) + "\n")
