"""Engine-level comparison with the systems users would otherwise pick, on the same weights.

    .venv/bin/python bench/peers.py --size base            # Marian-base shape, random weights
    .venv/bin/python bench/peers.py --model DIR            # a real checkpoint (Marian or ours)
    .venv/bin/python bench/peers.py --size tiny            # smoke test, seconds
    .venv/bin/python bench/peers.py --arch nllb            # NLLB-200-600M shape, random weights
    .venv/bin/python bench/peers.py --arch nllb --size tiny   # its smoke test, seconds

Systems (``--systems``): ``ours`` and ``ours-int8`` (our ONNX export run by
``service.runtime.engine.Engine``; ``ours-plain``: the fp32 export without the exact int8 screen of
greedy steps, export/vocab_screen.py, which large vocabularies get), ``ct2`` and ``ct2-int8``
(CTranslate2), ``optimum`` (Optimum's ``ORTModelForSeq2SeqLM``, from bench/.venv-optimum:
``bash bench/setup_optimum.sh``) and ``transformers`` (``MarianMTModel.generate``, eager
PyTorch). All of them read one Hugging Face Marian directory: the random model built here, the
``--model`` dir itself, or, for a checkpoint in our format, its conversion by
bench/to_marian.py (logits checked against ours).

Method (BENCHMARKS.md): greedy and beam 4 at each batch size; every system forced to produce
exactly ``--new-tokens`` ids where it can (``min_new_tokens = max_new_tokens``,
``forced_eos_token_id=None``; CTranslate2 ``min_decoding_length = max_decoding_length``). Our
engine has no minimum length, so the random models have eos suppressed in their logits bias,
and every system's tokens/s counts the ids it really produced. Same threads everywhere (ORT
intra-op, CTranslate2 intra_threads, torch.set_num_threads), warm-up runs not timed, median
of the timed runs. Cell by cell: every system times a cell in a process of its own, then the
next cell, the order of the systems reversed from cell to cell, so two systems' figures for a
cell are taken seconds apart, not minutes (``--per-system`` for one process per system).

``--arch nllb``: a random M2M-100 model of NLLB-200-distilled-600M's shape (12+12 layers, d 1024,
16 heads, FFN 4096, 256,206 ids: pieces, 202 language codes after them, <mask>), with a tiny
SentencePiece model and NLLB's tokenizer config beside it (bench/nllb_model.py). Sources are
``[source code, pieces…, </s>]``; every system forces the same target-language code as the
first generated id (ours: ``DecodeRequest.forced_prefix``; CTranslate2: ``target_prefix``;
transformers: ``forced_bos_token_id``) and then generates ``--new-tokens`` ids, the code not
counted. ``optimum`` is not run for NLLB.

Memory: every worker reports its peak resident memory (``peak_rss_mb``, the time phase's
process: model loaded and every cell run), printed after the tables.

Results: a table on stdout, ``bench/results/peers-<name>.json`` and ``peers-<name>.md`` (a
fragment for BENCHMARKS.md). Exports and conversions are cached in ``bench/work/<name>/`` and
rebuilt when the model changes (``--rebuild`` forces it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO_ROOT))

from peer_timing import COMPLETE_MARKER  # noqa: E402

from loadtest.machine import machine_facts  # noqa: E402

MAIN_PYTHON = sys.executable
OPTIMUM_PYTHON = BENCH_DIR / ".venv-optimum" / "bin" / "python"
ALL_SYSTEMS = (
    "ours",
    "ours-plain",
    "ours-int8",
    "ours-fp16",
    "ct2",
    "ct2-int8",
    "optimum",
    "transformers",
)
# On ``--device cuda``: our fp32 and fp16 exports on the CUDA provider, CTranslate2 in float16
# and int8_float16, transformers in fp16 (the int8 screen and int8 exports are CPU-only).
CUDA_SYSTEMS = ("ours", "ours-fp16", "ct2", "ct2-int8", "transformers")
REFERENCE_SYSTEM = "transformers"  # outputs of the others are compared with its outputs
# ours (fp32 with the int8 screen of greedy steps) against ours-plain (without): same outputs
SCREEN_CHECK = ("ours", "ours-plain")
SCREEN_CHECK_KEY = "same_output_ours_as_ours_plain"
# (ours, peer) pairs whose speed ratio is reported: fp32 against everything, int8 against int8
RATIO_PAIRS = (
    ("ours", "transformers"),
    ("ours", "optimum"),
    ("ours", "ct2"),
    ("ours-plain", "ct2"),
    ("ours-int8", "ct2-int8"),
    ("ours-fp16", "ct2"),  # CUDA: fp16 against CTranslate2 float16
    ("ours-fp16", "ct2-int8"),  # CUDA: against int8_float16
    ("ours-fp16", "transformers"),
)
EOS_SUPPRESSION = -1.0e4  # added to eos's logits bias in random models: fixed-length outputs

# Random Marian shapes. "base" is OPUS-MT-base (Helsinki-NLP/opus-mt-*): 6+6 layers, d 512,
# 8 heads, ffn 2048, shared 58101-token vocabulary, tied output, swish, post-norm.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_position_embeddings=256,
    ),
    "base": dict(
        vocab_size=58101,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        max_position_embeddings=512,
    ),
}
# Defaults per size, chosen so that a default base run fits in ~10 minutes on 2 cores.
SIZE_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(batches="1,8", new_tokens=8, repeats=3, warmup_tokens=4),
    "base": dict(batches="1,8,32", new_tokens=64, repeats=3, warmup_tokens=16),
}
QUICK = dict(batches="1,8", new_tokens=32, repeats=1, warmup_tokens=8)
ARCHES = ("marian", "nllb")
NLLB_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(batches="1,8", new_tokens=8, repeats=3, warmup_tokens=4),
    "600m": dict(batches="1,8", new_tokens=64, repeats=3, warmup_tokens=16),
}


# --- the model ---------------------------------------------------------------------------


def build_random_marian(output_dir: Path, size: str, seed: int, init_std: float) -> None:
    """A random MarianMTModel of ``size`` plus placeholder tokenizer files.

    ``init_std`` above transformers' 0.02 makes outputs depend on the input (docs/toolchain.md). The
    pad row of the embeddings is zero, as in real Marian models (CTranslate2 starts decoding from
    a zero embedding, the others from pad's). Eos gets a large negative logits bias, so every
    system, ours included, generates exactly ``max_new_tokens`` ids.
    """
    import torch
    from to_marian import write_placeholder_tokenizer
    from transformers import MarianConfig, MarianMTModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    shape = SIZES[size]
    vocab_size = shape["vocab_size"]
    config = MarianConfig(
        **shape,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=vocab_size - 1,
        eos_token_id=0,
        decoder_start_token_id=vocab_size - 1,
        forced_eos_token_id=None,
        init_std=init_std,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[config.pad_token_id].zero_()
        bias = torch.randn_like(model.final_logits_bias)
        bias[0, config.eos_token_id] = EOS_SUPPRESSION
        model.final_logits_bias.copy_(bias)
    model.save_pretrained(output_dir)
    write_placeholder_tokenizer(output_dir, vocab_size, config.pad_token_id)


def model_key(args: argparse.Namespace) -> dict[str, Any]:
    """What the cached artifacts in the work dir were built from."""
    if args.model is None:
        return {
            "arch": args.arch,
            "size": args.size,
            "seed": args.seed,
            "init_std": args.init_std,
            "v": 1,
        }
    model_dir = Path(args.model).resolve()
    digest = hashlib.sha256()
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return {"model": str(model_dir), "files": digest.hexdigest()[:16]}


def prepare_marian_dir(args: argparse.Namespace, work_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The Marian dir every system reads, (re)building the work dir when the model changed."""
    key = model_key(args)
    key_file = work_dir / "key.json"
    if args.rebuild or not key_file.exists() or json.loads(key_file.read_text()) != key:
        shutil.rmtree(work_dir, ignore_errors=True)
        work_dir.mkdir(parents=True)
    notes: dict[str, Any] = {}
    if args.model is not None:
        from models.checkpoint import is_marian_dir

        if is_marian_dir(args.model):
            marian_dir = Path(args.model).resolve()
            notes["source"] = "Marian directory, used as is"
        else:
            marian_dir = work_dir / "marian"
            if not (marian_dir / COMPLETE_MARKER).exists():
                from to_marian import convert

                difference = convert(args.model, marian_dir)
                (marian_dir / COMPLETE_MARKER).write_text(json.dumps(difference))
            difference = json.loads((marian_dir / COMPLETE_MARKER).read_text())
            notes["source"] = "our checkpoint, converted by bench/to_marian.py"
            notes["max_logit_difference_vs_ours"] = difference
    elif args.arch == "nllb":
        from nllb_model import build_random_nllb

        marian_dir = work_dir / "nllb"
        if not (marian_dir / COMPLETE_MARKER).exists():
            build_random_nllb(marian_dir, args.size, args.seed, args.init_std)
            (marian_dir / COMPLETE_MARKER).write_text("")
        notes["source"] = (
            f"random M2M-100 of NLLB-200 '{args.size}' shape (seed {args.seed}, init_std "
            f"{args.init_std}, eos suppressed: bench/nllb_model.py)"
        )
    else:
        marian_dir = work_dir / "marian"
        if not (marian_dir / COMPLETE_MARKER).exists():
            build_random_marian(marian_dir, args.size, args.seed, args.init_std)
            (marian_dir / COMPLETE_MARKER).write_text("")
        notes["source"] = (
            f"random Marian '{args.size}' (seed {args.seed}, init_std {args.init_std}, "
            "eos suppressed in the logits bias)"
        )
    key_file.write_text(json.dumps(key) + "\n")
    return marian_dir, notes


def read_marian_config(marian_dir: Path) -> dict[str, Any]:
    return json.loads((marian_dir / "config.json").read_text())


def make_sources(config: dict[str, Any], count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` sources of exactly ``length`` ids (``length - 1`` random ordinary tokens, then
    eos): equal lengths, so no system pays for padding the others do not."""
    special = {config["pad_token_id"], config["eos_token_id"], config.get("decoder_start_token_id")}
    special.add(1)  # <unk> in the Marian layout
    vocab_size = config["vocab_size"]
    rng = random.Random(seed)
    sources = []
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < length - 1:
            token = rng.randrange(vocab_size)
            if token not in special:
                ids.append(token)
        sources.append(ids + [config["eos_token_id"]])
    return sources


# --- running the workers -----------------------------------------------------------------


def make_nllb_sources(
    config: dict[str, Any], count: int, length: int, seed: int
) -> tuple[list[list[int]], int]:
    """``[source code, length - 2 random pieces, </s>]`` per source, and the target code
    every system forces (bench/nllb_model.py places the codes)."""
    from nllb_model import language_ids

    codes = language_ids(config["vocab_size"])
    rng = random.Random(seed)
    first_code = min(codes.values())
    sources = [
        [codes["eng_Latn"], *(rng.randrange(4, first_code) for _ in range(length - 2)), 2]
        for _ in range(count)
    ]
    return sources, codes["deu_Latn"]


def worker_command(system: str) -> list[str]:
    if system == "optimum":
        return [str(OPTIMUM_PYTHON), str(BENCH_DIR / "optimum_worker.py")]
    return [MAIN_PYTHON, str(BENCH_DIR / "peer_workers.py")]


def artifact_dir(system: str, work_dir: Path) -> Path | None:
    return None if system == "transformers" else work_dir / system


def call_worker(request: dict[str, Any], work_dir: Path, threads: int) -> dict[str, Any]:
    system, phase = request["system"], request["phase"]
    request_path = work_dir / f"request-{system}-{phase}.json"
    result_path = work_dir / f"result-{system}-{phase}.json"
    result_path.unlink(missing_ok=True)
    request_path.write_text(json.dumps({**request, "result_path": str(result_path)}))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }
    started = time.perf_counter()
    completed = subprocess.run(
        [*worker_command(system), str(request_path)],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=None,  # progress lines go straight to the terminal
        text=True,
    )
    if result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        result = {"system": system, "error": f"worker exited {completed.returncode}, no result"}
        if completed.stdout:
            result["error"] += "\n" + completed.stdout[-2000:]
    result["process_s"] = round(time.perf_counter() - started, 2)
    return result


def run_system(
    system: str, base_request: dict[str, Any], work_dir: Path, threads: int
) -> dict[str, Any]:
    if system == "optimum" and not OPTIMUM_PYTHON.exists():
        return {"system": system, "error": f"{OPTIMUM_PYTHON} missing: bash bench/setup_optimum.sh"}
    artifacts = artifact_dir(system, work_dir)
    request = {
        **base_request,
        "system": system,
        "artifact_dir": str(artifacts) if artifacts else None,
        "fp32_dir": str(work_dir / "ours"),
    }
    built: dict[str, Any] = {}
    if artifacts is not None and not (artifacts / COMPLETE_MARKER).exists():
        shutil.rmtree(artifacts, ignore_errors=True)
        artifacts.mkdir(parents=True)
        print(f"[{system}] building {artifacts} ...", file=sys.stderr)
        built = call_worker({**request, "phase": "build"}, work_dir, threads)
        if "error" in built:
            return {"system": system, "error": built["error"], "build": built}
    print(f"[{system}] timing ...", file=sys.stderr, flush=True)
    result = call_worker({**request, "phase": "time"}, work_dir, threads)
    if built:
        result["build"] = {key: built[key] for key in built if key not in ("system", "phase")}
    if artifacts is not None:
        result["artifact_mb"] = round(directory_megabytes(artifacts), 1)
    return result


def run_interleaved(
    systems: list[str],
    base_request: dict[str, Any],
    work_dir: Path,
    threads: int,
    reverse_first: bool = False,
) -> dict[str, dict[str, Any]]:
    """Cell by cell: every system times one cell in a process of its own, then the next cell,
    with the order of the systems reversed from one cell to the next.

    The machine's speed drifts (on a shared VM, memory bandwidth by up to 2x within an hour); a
    cell's figures for two systems measured minutes apart carry that drift in their ratio,
    figures measured seconds apart much less of it. One process per system and cell keeps the
    rule that no system shares a process (thread pools, allocators) with another."""
    merged: dict[str, dict[str, Any]] = {}
    for index, cell in enumerate(base_request["cells"]):
        order = systems if (index % 2 == 1) == reverse_first else systems[::-1]
        for system in order:
            if "error" in merged.get(system, {}):
                continue
            result = run_system(system, {**base_request, "cells": [cell]}, work_dir, threads)
            if system not in merged or "error" in result:
                merged[system] = {**merged.get(system, {}), **result}
                continue
            merged[system]["cells"] = merged[system].get("cells", []) + result.get("cells", [])
            merged[system]["process_s"] = round(
                merged[system].get("process_s", 0) + result.get("process_s", 0), 2
            )
            peaks = [merged[system].get("peak_rss_mb"), result.get("peak_rss_mb")]
            if known := [peak for peak in peaks if peak is not None]:
                merged[system]["peak_rss_mb"] = max(known)  # the largest cell's process
    return merged


def directory_megabytes(path: Path) -> float:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file()) / 2**20


# --- summarising -------------------------------------------------------------------------


def cell_key(beam: int, batch: int) -> str:
    return f"{'greedy' if beam == 1 else f'beam {beam}'} / {batch}"


def identical_share(outputs: list, reference: list) -> float:
    """The share of sentences whose output equals the reference's."""
    same = sum(a == b for a, b in zip(outputs, reference, strict=True))
    return round(same / len(reference), 3)


def summarise(results: dict[str, dict[str, Any]], new_tokens: int) -> dict[str, Any]:
    """Per cell: tokens/s of every system, ours/peer ratios, output agreement, lengths."""
    cells: dict[str, dict[str, Any]] = {}
    for system, result in results.items():
        for cell in result.get("cells", []):
            entry = cells.setdefault(
                cell_key(cell["beam"], cell["batch"]),
                {"beam": cell["beam"], "batch": cell["batch"], "tokens_per_s": {}},
            )
            entry["tokens_per_s"][system] = cell["tokens_per_s"]
            entry.setdefault("mean_length", {})[system] = cell["mean_length"]
    for key, entry in cells.items():
        speeds = entry["tokens_per_s"]
        entry["ratios"] = {
            f"{ours}/{peer}": round(speeds[ours] / speeds[peer], 2)
            for ours, peer in RATIO_PAIRS
            if ours in speeds and peer in speeds
        }
        entry["all_fixed_length"] = all(
            length == new_tokens for length in entry["mean_length"].values()
        )
        reference = _cell_outputs(results.get(REFERENCE_SYSTEM, {}), entry)
        if reference is not None:
            agreement = {}
            for system, result in results.items():
                outputs = _cell_outputs(result, entry)
                if outputs is not None and system != REFERENCE_SYSTEM:
                    agreement[system] = identical_share(outputs, reference)
            entry[f"same_output_as_{REFERENCE_SYSTEM}"] = agreement
        screened, plain = (_cell_outputs(results.get(name, {}), entry) for name in SCREEN_CHECK)
        if screened is not None and plain is not None:  # the screen must change no output
            entry[SCREEN_CHECK_KEY] = identical_share(screened, plain)
        cells[key] = entry
    return cells


def merge_rounds(
    rounds: list[dict[str, dict[str, Any]]], systems: list[str]
) -> dict[str, dict[str, Any]]:
    """One result per system: the first round's, with every cell's tokens/s replaced by the
    median over the rounds (each round's figure kept in ``tokens_per_s_rounds``)."""
    if len(rounds) == 1:
        return rounds[0]
    merged: dict[str, dict[str, Any]] = {}
    for system in systems:
        result = dict(rounds[0][system])
        if "error" not in result:
            cells = []
            for cell in result.get("cells", []):
                figures = [
                    other["tokens_per_s"]
                    for results in rounds
                    for other in results[system].get("cells", [])
                    if (other["beam"], other["batch"]) == (cell["beam"], cell["batch"])
                ]
                cells.append(
                    {
                        **cell,
                        "tokens_per_s": round(statistics.median(figures), 2),
                        "tokens_per_s_rounds": figures,
                    }
                )
            result["cells"] = cells
        merged[system] = result
    return merged


def _cell_outputs(result: dict[str, Any], entry: dict[str, Any]) -> list[list[int]] | None:
    for cell in result.get("cells", []):
        if cell["beam"] == entry["beam"] and cell["batch"] == entry["batch"]:
            return cell["outputs"]
    return None


def format_tables(
    summary: dict[str, Any], systems: list[str], markdown: bool, new_tokens: int
) -> str:
    ratio_names = [
        f"{ours}/{peer}" for ours, peer in RATIO_PAIRS if ours in systems and peer in systems
    ]
    header = ["decoding", "batch", *systems, *ratio_names]
    rows = []
    for entry in sorted(summary.values(), key=lambda e: (e["beam"], e["batch"])):
        speeds = entry["tokens_per_s"]
        row = ["greedy" if entry["beam"] == 1 else f"beam {entry['beam']}", str(entry["batch"])]
        for system in systems:
            cell = f"{speeds[system]:.0f}" if system in speeds else "-"
            if system in entry["mean_length"] and entry["mean_length"][system] != new_tokens:
                cell += "*"
            row.append(cell)
        row += [
            f"{entry['ratios'][name]:.2f}x" if name in entry["ratios"] else "-"
            for name in ratio_names
        ]
        rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(text.rjust(width) for text, width in zip(header, widths, strict=True))]
    lines += [
        "  ".join(text.rjust(width) for text, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(lines)


def round_ratio_lines(report: dict[str, Any]) -> list[str]:
    """Per cell and ratio pair, the ratio within every round (empty for one round)."""
    systems = report["systems"]
    lines = []
    for key, entry in sorted(
        report["cells"].items(), key=lambda item: (item[1]["beam"], item[1]["batch"])
    ):
        parts = []
        for ours, peer in RATIO_PAIRS:
            figures = [
                next(
                    (
                        cell.get("tokens_per_s_rounds")
                        for cell in systems.get(name, {}).get("cells", [])
                        if (cell["beam"], cell["batch"]) == (entry["beam"], entry["batch"])
                    ),
                    None,
                )
                for name in (ours, peer)
            ]
            if figures[0] and figures[1]:
                ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(*figures, strict=True))
                parts.append(f"{ours}/{peer} {ratios}")
        if parts:
            lines.append(f"- {key}: " + "; ".join(parts))
    return lines


def markdown_fragment(report: dict[str, Any], systems: list[str]) -> str:
    settings = report["settings"]
    machine = report["machine"]
    versions: dict[str, str] = {}
    for result in report["systems"].values():
        versions.update(result.get("versions", {}))
    version_text = ", ".join(f"{name} {version}" for name, version in sorted(versions.items()))
    lines = [
        f"<!-- generated by bench/peers.py on {report['date']}; command: {report['command']} -->",
        f"Model: {report['model']['source']}. Source {settings['source_length']} tokens, "
        f"{settings['new_tokens']} new tokens, {settings['threads']} threads, "
        f"median of up to {settings['repeats']} timed runs after warm-up, "
        f"{settings.get('interleave', 'system by system')}"
        + (
            f"; {settings['rounds']} rounds (every other one in reverse order), a cell's "
            "figure is the median over the rounds. "
            if settings.get("rounds", 1) > 1
            else ". "
        )
        + f"Machine: {machine['cpu']} ({machine['logical_cpus']} logical CPUs, "
        f"{'/'.join(machine['simd']) or 'no AVX2'}).",
        "",
        "Tokens/s (generated ids per second; `*`: the system produced fewer than the forced "
        "length, its figure counts the ids it produced):",
        "",
        format_tables(report["cells"], systems, markdown=True, new_tokens=settings["new_tokens"]),
        "",
        f"Versions: {version_text}.",
    ]
    round_lines = round_ratio_lines(report)
    if round_lines:
        lines += ["", "Ratios of each round (ours and peer measured in the same round):", ""]
        lines += round_lines
    agreement_lines = []
    for key, entry in sorted(
        report["cells"].items(), key=lambda item: (item[1]["beam"], item[1]["batch"])
    ):
        same = entry.get(f"same_output_as_{REFERENCE_SYSTEM}")
        if same:
            text = ", ".join(f"{system} {share:.0%}" for system, share in same.items())
            agreement_lines.append(f"- {key}: {text}")
    if agreement_lines:
        lines += ["", f"Outputs identical to {REFERENCE_SYSTEM}'s (share of sentences):", ""]
        lines += agreement_lines
    if screen_line := screen_check_line(report["cells"]):
        lines += ["", screen_line]
    peaks = [
        f"{system} {report['systems'][system]['peak_rss_mb']:.0f} MB"
        for system in systems
        if report["systems"].get(system, {}).get("peak_rss_mb") is not None
    ]
    if peaks:
        lines += ["", "Peak resident memory (each system's own process): " + ", ".join(peaks) + "."]
    return "\n".join(lines) + "\n"


def screen_check_line(cells: dict[str, dict[str, Any]]) -> str:
    """ours' outputs against ours-plain's, per cell (empty when either was not run)."""
    shares = [
        f"{key} {entry[SCREEN_CHECK_KEY]:.0%}"
        for key, entry in sorted(
            cells.items(), key=lambda item: (item[1]["beam"], item[1]["batch"])
        )
        if SCREEN_CHECK_KEY in entry
    ]
    return f"Outputs of ours identical to ours-plain's: {', '.join(shares)}" if shares else ""


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    which = parser.add_mutually_exclusive_group()
    parser.add_argument("--arch", choices=ARCHES, default="marian", help="random model's kind")
    which.add_argument(
        "--size",
        choices=sorted({*SIZES, *NLLB_DEFAULTS}),
        help="random model: Marian tiny/base (default base), NLLB tiny/600m (default 600m)",
    )
    which.add_argument("--model", help="a Marian dir or a checkpoint in our format")
    parser.add_argument("--systems", help="comma-separated (default: every one the device runs)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: every system on the GPU (ours fp32/fp16, CTranslate2 float16/int8_float16, "
        "transformers fp16); a system that cannot load CUDA fails instead of falling back",
    )
    parser.add_argument("--batches", help="comma-separated batch sizes (base: 1,8,32)")
    parser.add_argument("--beams", default="1,4", help="comma-separated beam sizes")
    parser.add_argument("--new-tokens", type=int, help="forced output length (base: 64)")
    parser.add_argument("--source-length", type=int, default=24, help="ids per source, eos too")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, help="timed runs per cell at most (base: 3)")
    parser.add_argument(
        "--max-cell-seconds",
        type=float,
        default=8.0,
        help="stop repeating a cell once its timed runs took this long (at least one run)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every system this many times, every other round in reverse order; "
        "a cell's figure is the median over the rounds",
    )
    parser.add_argument(
        "--per-system",
        dest="interleave",
        action="store_false",
        help="time all cells of one system, then the next system (default: cell by cell, "
        "every system in its own process per cell, the order reversed from cell to cell)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per cell")
    parser.add_argument("--warmup-tokens", type=int, help="new tokens of a warm-up run")
    parser.add_argument("--quick", action="store_true", help="batches 1,8; 32 tokens; 1 run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=0.5, help="random models' init std")
    parser.add_argument("--rebuild", action="store_true", help="discard cached exports")
    parser.add_argument("--work-dir", type=Path, default=BENCH_DIR / "work")
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    args = parser.parse_args(argv)
    if args.systems is None:
        args.systems = ",".join(CUDA_SYSTEMS if args.device == "cuda" else ALL_SYSTEMS)
        if args.device == "cpu":
            args.systems = args.systems.replace("ours-fp16,", "")
    if args.arch == "nllb":
        if args.model is not None:
            parser.error("--arch nllb builds its random model; --model is for Marian dirs")
        args.size = args.size or "600m"
        if args.size not in NLLB_DEFAULTS:
            parser.error(f"NLLB sizes: {', '.join(NLLB_DEFAULTS)}")
        args.systems = ",".join(s for s in args.systems.split(",") if s != "optimum")
    elif args.size not in (None, *SIZES):
        parser.error(f"Marian sizes: {', '.join(SIZES)}")
    if args.model is None and args.size is None:
        args.size = "base"
    size_defaults = NLLB_DEFAULTS if args.arch == "nllb" else SIZE_DEFAULTS
    defaults = dict(size_defaults.get(args.size or "base", SIZE_DEFAULTS["base"]))
    if args.quick:
        defaults.update(QUICK)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.warmup_tokens = min(args.warmup_tokens, args.new_tokens)
    unknown = set(args.systems.split(",")) - set(ALL_SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(ALL_SYSTEMS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    load_at_start = list(os.getloadavg())  # was something else running before this run?
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    name = args.size if args.model is None else Path(args.model).resolve().name
    if args.arch == "nllb":
        name = f"nllb-{args.size}"
    if args.device == "cuda":
        name = f"{name}-cuda"
    work_dir = (args.work_dir / name).resolve()
    systems = [system for system in ALL_SYSTEMS if system in args.systems.split(",")]
    batches = [int(batch) for batch in args.batches.split(",")]
    beams = [int(beam) for beam in args.beams.split(",")]

    marian_dir, model_notes = prepare_marian_dir(args, work_dir)
    config = read_marian_config(marian_dir)
    if args.source_length + args.new_tokens > config.get("max_position_embeddings", 512):
        raise SystemExit("source length + new tokens exceed the model's positions")
    if args.arch == "nllb":
        sources, forced = make_nllb_sources(config, max(batches), args.source_length, args.seed)
    else:
        sources, forced = make_sources(config, max(batches), args.source_length, args.seed), None
    base_request = {
        "marian_dir": str(marian_dir),
        "arch": args.arch,
        "forced_id": forced,  # NLLB: the target code every system generates first
        "threads": args.threads,
        "device": args.device,
        "sources": sources,
        "new_tokens": args.new_tokens,
        "cells": [{"beam": beam, "batch": batch} for beam in beams for batch in batches],
        "warmup": args.warmup,
        "warmup_tokens": args.warmup_tokens,
        "repeats": args.repeats,
        "max_cell_seconds": args.max_cell_seconds,
        "pad_id": config["pad_token_id"],
        "eos_id": config["eos_token_id"],
    }
    print(
        f"peers: {name} ({model_notes['source']}); systems {', '.join(systems)}; beams {beams}; "
        f"batches {batches}; {args.new_tokens} new tokens; {args.threads} threads",
        file=sys.stderr,
    )

    rounds: list[dict[str, dict[str, Any]]] = []
    for round_index in range(args.rounds):
        # Every other round in reverse order: a system measured first in one round is measured
        # last in the next, so a drift of the machine's speed does not favour one system.
        order = systems if round_index % 2 == 0 else systems[::-1]
        if args.rounds > 1:
            print(f"round {round_index + 1}/{args.rounds}: {', '.join(order)}", file=sys.stderr)
        results_of_round: dict[str, dict[str, Any]] = {}
        if args.interleave:
            results_of_round = run_interleaved(
                systems, base_request, work_dir, args.threads, reverse_first=round_index % 2 == 1
            )
        else:
            for system in order:
                results_of_round[system] = run_system(system, base_request, work_dir, args.threads)
        for system, result in results_of_round.items():
            if "error" in result:
                print(f"[{system}] FAILED:\n{result['error']}", file=sys.stderr)
        rounds.append(results_of_round)
    results = merge_rounds(rounds, systems)

    summary = summarise(results, args.new_tokens)
    measured = [system for system in systems if results[system].get("cells")]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(["python", "bench/peers.py", *(argv or sys.argv[1:])]),
        "machine": {**machine_facts(), "load_average_at_start": load_at_start},
        "model": {
            "name": name,
            "marian_dir": str(marian_dir),
            **model_notes,
            **{key: config.get(key) for key in ("d_model", "encoder_layers", "decoder_layers")},
            "vocab_size": config.get("vocab_size"),
        },
        "settings": {
            "arch": args.arch,
            "systems": systems,
            "beams": beams,
            "batches": batches,
            "new_tokens": args.new_tokens,
            "source_length": args.source_length,
            "threads": args.threads,
            "device": args.device,
            "warmup": args.warmup,
            "warmup_tokens": args.warmup_tokens,
            "repeats": args.repeats,
            "rounds": args.rounds,
            "interleave": "cell by cell" if args.interleave else "system by system",
            "max_cell_seconds": args.max_cell_seconds,
        },
        "cells": summary,
        "systems": results,
        "total_s": round(time.perf_counter() - started, 1),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.results_dir / f"peers-{name}.json"
    markdown_path = args.results_dir / f"peers-{name}.md"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    markdown_path.write_text(markdown_fragment(report, measured))

    print()
    print(format_tables(summary, measured, markdown=False, new_tokens=args.new_tokens))
    for key, entry in sorted(summary.items(), key=lambda item: (item[1]["beam"], item[1]["batch"])):
        same = entry.get(f"same_output_as_{REFERENCE_SYSTEM}")
        if same:
            text = ", ".join(f"{system} {share:.0%}" for system, share in same.items())
            print(f"same output as {REFERENCE_SYSTEM}, {key}: {text}")
    if screen_line := screen_check_line(summary):
        print(screen_line)
    for system in measured:
        if (rss := results[system].get("peak_rss_mb")) is not None:
            print(f"peak RSS {system}: {rss:.0f} MB")
    failed = [system for system in systems if "error" in results[system]]
    print(
        f"\nwrote {json_path} and {markdown_path} in {report['total_s']:.0f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )


if __name__ == "__main__":
    main()
