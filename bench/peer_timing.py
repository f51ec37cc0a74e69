"""The timing loop and worker protocol shared by every system in ``bench/peers.py``.

Standard library only: it runs in the main venv and in the Optimum venv (bench/optimum_worker.py).

A worker is a process started as ``PYTHON WORKER REQUEST.json``. The request names the system,
the phase, the model and artifact directories, the threads, the source ids and the cells
(beam x batch). Phase "build" exports / converts the model into ``artifact_dir``; phase "time"
loads the system, runs every cell it was given (bench/peers.py gives one cell per process by
default) and writes the result JSON to ``request["result_path"]``. Processes of their own keep
the thread pools, OpenMP runtimes and allocators of one system from disturbing the next.

A ``run(sources, beam_size, new_tokens)`` function returns the generated ids of every source
(no start token, no eos); tokens/s counts those ids, so systems that stop early are not
credited with tokens they did not produce.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RunFn = Callable[[list[list[int]], int, int], list[list[int]]]
BuildFn = Callable[[dict[str, Any]], dict[str, Any]]  # request -> info for the result
LoadFn = Callable[[dict[str, Any]], tuple[RunFn, dict[str, Any]]]

COMPLETE_MARKER = ".complete"  # written into artifact_dir once a build has finished


def time_cells(run: RunFn, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Warm up and time every cell; the figure is the median of the timed runs.

    Each cell is warmed up by ``warmup`` runs of the same beam and batch (``warmup_tokens`` new
    tokens each: the same kernels and shapes, cheaper than a full run), then timed ``repeats``
    times, stopping early once ``max_cell_seconds`` of timed runs are spent (at least one).
    """
    sources: list[list[int]] = request["sources"]
    new_tokens: int = request["new_tokens"]
    results = []
    for cell in request["cells"]:
        beam, batch = cell["beam"], cell["batch"]
        batch_sources = sources[:batch]
        for _ in range(request["warmup"]):
            run(batch_sources, beam, request["warmup_tokens"])
        times: list[float] = []
        outputs: list[list[int]] = []
        for _ in range(request["repeats"]):
            started = time.perf_counter()
            generated = run(batch_sources, beam, new_tokens)
            times.append(time.perf_counter() - started)
            outputs = outputs or generated
            if sum(times) >= request["max_cell_seconds"]:
                break
        median = statistics.median(times)
        tokens = sum(len(ids) for ids in outputs)
        results.append(
            {
                "beam": beam,
                "batch": batch,
                "times_s": [round(t, 4) for t in times],
                "median_s": round(median, 4),
                "tokens": tokens,
                "tokens_per_s": round(tokens / median, 2),
                "mean_length": round(tokens / len(outputs), 2),
                "outputs": outputs,
            }
        )
        print(
            f"  {request['system']:>13} beam {beam} batch {batch:>3}: "
            f"{tokens / median:8.1f} tok/s ({median:.3f} s, {len(times)} runs)",
            file=sys.stderr,
            flush=True,
        )
    return results


def serve(build: BuildFn, load: LoadFn) -> None:
    """Worker entry point. Phase "build": write the system's artifacts (export, conversion) into
    ``artifact_dir`` and mark it complete. Phase "time": load, time every cell, write the result.
    Building runs in its own process so that the exporter's threads and memory are gone before
    anything is timed."""
    request = json.loads(Path(sys.argv[1]).read_text())
    result: dict[str, Any] = {"system": request["system"], "phase": request["phase"]}
    try:
        started = time.perf_counter()
        if request["phase"] == "build":
            result.update(build(request))
            Path(request["artifact_dir"], COMPLETE_MARKER).write_text("")
            result["build_s"] = round(time.perf_counter() - started, 2)
        else:
            run, info = load(request)
            result["load_s"] = round(time.perf_counter() - started, 2)
            result.update(info)
            result["cells"] = time_cells(run, request)
            result["peak_rss_mb"] = peak_rss_mb()
    except Exception:  # reported by the orchestrator; one failing system must not stop the rest
        result["error"] = traceback.format_exc()
    Path(request["result_path"]).write_text(json.dumps(result) + "\n")


def peak_rss_mb() -> float | None:
    """This process's peak resident memory so far, None where unknown. ``VmHWM`` (Linux),
    not ``ru_maxrss``: that one survives ``exec`` and would report the orchestrator's peak
    when it is larger."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return None


def strip_generated(rows: list[list[int]], eos_id: int, pad_id: int) -> list[list[int]]:
    """``generate`` output rows (start token removed) -> ids up to the first eos or pad."""
    stripped = []
    for row in rows:
        end = next((i for i, token in enumerate(row) if token in (eos_id, pad_id)), len(row))
        stripped.append(row[:end])
    return stripped


def generate_runner(model: Any, pad_id: int, eos_id: int, forced_id: int | None = None) -> RunFn:
    """A ``RunFn`` over a Hugging Face-style ``generate`` (transformers' MarianMTModel and
    Optimum's ORTModelForSeq2SeqLM alike): right-padded ids in, exactly ``new_tokens`` forced
    out, pad banned as Marian's generation config does. ``forced_id``: a target-language code
    generated first (``forced_bos_token_id``, NLLB), then ``new_tokens`` more; it is not
    returned. torch is imported here so this module stays importable without it."""
    import torch

    forced = {} if forced_id is None else {"forced_bos_token_id": forced_id}
    extra = 0 if forced_id is None else 1  # generate counts the forced code

    def run(sources: list[list[int]], beam_size: int, new_tokens: int) -> list[list[int]]:
        width = max(len(ids) for ids in sources)
        input_ids = torch.full((len(sources), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sources), width), dtype=torch.long)
        for row, ids in enumerate(sources):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
        device = getattr(model, "device", torch.device("cpu"))  # CUDA: the ids go there too
        with torch.inference_mode():
            sequences = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                num_beams=beam_size,
                do_sample=False,
                min_new_tokens=new_tokens + extra,
                max_new_tokens=new_tokens + extra,
                forced_eos_token_id=None,
                bad_words_ids=[[pad_id]],
                length_penalty=1.0,
                **forced,
            )
        return strip_generated(sequences[:, 1 + extra :].tolist(), eos_id, pad_id)

    return run


def package_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
