"""Decoder steps and rows per step of beam search: ours against CTranslate2, same batches.

    .venv/bin/python bench/beam_steps.py --model models/default --export build/onnx/default \\
        [--batches 8,32,64] [--beam 4] [--sentences 256]

Counts, on the held-out strings and length-sorted batches of bench/real_peers.py, what each
engine computes rather than how fast: per batch, the decoder steps until the last sentence
ends, and the rows those steps carry (the decoder's work is about rows x steps).

- **ours**: the engine stepped by hand (``Engine.add``, ``Engine.step``), the rows of every
  step read from ``Engine.active_rows`` before it;
- **CT2**: ``translate_batch(beam_size=K, num_hypotheses=K, return_scores=True,
  return_end_token=True)``. Its search (``BeamSearch::search`` in decoding.cc) runs the
  first step with one row per sentence and then K, drops a sentence's rows at the step it
  finishes, and with a length penalty finishes a sentence once K hypotheses have ended (no
  comparison with the live beams); so a sentence's last step is the length of its longest
  returned hypothesis (eos included: the hypotheses it keeps were all registered by then,
  and one at the last step);
- **ours, CT2's stop** (``--ct2-stop``): our search with CTranslate2's rule (stop once K
  hypotheses have ended) instead of transformers' ``early_stopping=False`` heuristic (and no
  live beam, normalised at its current length, beats the worst of them): the steps our
  semantics add, and how many outputs the rule would change.

``--split ROWS``: where one of our steps of about ROWS rows goes (steps of ROWS - 8 to ROWS
rows, batches of ROWS / K sentences): the decoder's ``session.run``, the rest of
``HostKV.decode`` (feeds, spare-slot mask, writing the new keys), the step inputs (bans and
watched ids), the searches (``advance_searches``: the beams' top-2K and bookkeeping), the
cache moves (``HostKV.select``: beam reorders, rows leaving, the first step's repeat) and
everything else in ``Engine.step``; mean milliseconds per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from bench.ct2_convert import decoding_options  # noqa: E402
from bench.real_peers import (  # noqa: E402
    MAX_NEW_TOKENS,
    batches,
    heldout_texts,
    sample,
    source_ids,
)


def ours_counts(engine: Any, sources: list[list[int]], beam: int) -> dict[str, Any]:
    """Steps and rows of one batch through our engine, and its outputs."""
    from service.runtime.types import DecodeRequest

    requests = [
        DecodeRequest(("steps", index), list(src), beam, MAX_NEW_TOKENS)
        for index, src in enumerate(sources)
    ]
    engine.add(requests)
    rows: list[int] = []
    outputs: dict[Any, list[int]] = {}
    request_steps: dict[Any, int] = {}
    while engine.active_requests:
        rows.append(engine.active_rows)
        for done in engine.step():
            outputs[done.request_id] = done.tokens
            request_steps[done.request_id] = done.steps
    ids = [request.request_id for request in requests]
    return {
        "steps": len(rows),
        "rows": rows,
        "sentence_steps": [request_steps[i] for i in ids],
        "outputs": [outputs[i] for i in ids],
    }


def ct2_counts(translator: Any, vocab: list[str], sources: list[list[int]], beam: int) -> dict:
    """Steps and rows of one batch through CTranslate2's beam search (see the module's doc)."""
    results = translator.translate_batch(
        [[vocab[i] for i in row] for row in sources],
        **decoding_options(beam, MAX_NEW_TOKENS),
        num_hypotheses=beam,
        return_end_token=True,
        return_scores=True,
    )
    finish = [max(len(hypothesis) for hypothesis in result.hypotheses) for result in results]
    steps = max(finish)
    rows = [len(sources)] + [beam * sum(f > step for f in finish) for step in range(1, steps)]
    return {"steps": steps, "rows": rows, "sentence_steps": finish}


def patch_ct2_stop() -> None:
    """Our beam search with CTranslate2's stop: K ended hypotheses, whatever the live beams."""
    from service.runtime import search

    original = search.advance_beams

    def advance(searches, head, beam_rows):
        result = original(searches, head, beam_rows)
        for one in searches:
            one.done = len(one.finished) == one.num_rows or one.steps >= one.max_new_tokens
        return result

    search.advance_beams = advance
    import service.runtime.stepping as stepping

    stepping.advance_beams = advance


def split(export: Path, sources: list[list[int]], beam: int, rows: int) -> dict[str, Any]:
    """Mean ms per step of about ``rows`` rows, by part (see the module's doc)."""
    import time

    from service.runtime import groups, host_kv
    from service.runtime.engine import Engine
    from service.runtime.types import DecodeRequest

    engine = Engine.from_dir(export, provider="cpu", intra_op_threads=1)
    engine.warmup()
    spent: dict[str, float] = {}

    def timed(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

        setattr(owner, name, wrapper)

    timed(engine.model.decoder, "run", "ort_run")
    timed(host_kv.HostKV, "decode", "decode")
    timed(host_kv.HostKV, "select", "select")
    timed(groups.Group, "step_inputs", "step_inputs")
    timed(groups, "advance_searches", "searches")
    timed(Engine, "step", "engine_step")
    plan = batches(sources, max(1, rows // beam))
    totals: dict[str, float] = {}
    steps = 0
    for batch in plan:
        engine.translate_ids([sources[i] for i in batch], beam_size=beam)  # untimed pass
    for batch in plan:
        engine.add([DecodeRequest(("split", i), sources[i], beam, MAX_NEW_TOKENS) for i in batch])
        while engine.active_requests:
            count = engine.active_rows
            spent.clear()
            engine.step()
            if rows - 8 <= count <= rows:
                steps += 1
                for label, seconds in spent.items():
                    totals[label] = totals.get(label, 0.0) + seconds
    ms = {label: 1e3 * seconds / max(1, steps) for label, seconds in totals.items()}
    ms["decode"] -= ms.get("ort_run", 0.0)  # its own host work
    inside = ("ort_run", "decode", "step_inputs", "searches", "select")
    ms["other"] = ms.pop("engine_step", 0.0) - sum(ms.get(label, 0.0) for label in inside)
    return {"steps": steps, "ms_per_step": {k: round(v, 3) for k, v in ms.items()}}


def summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(cell["steps"] for cell in cells)
    rows = sum(sum(cell["rows"]) for cell in cells)
    sentence_steps = [s for cell in cells for s in cell["sentence_steps"]]
    return {
        "batch_steps": steps,
        "row_steps": rows,
        "mean_rows_per_step": round(rows / steps, 1),
        "mean_sentence_steps": round(sum(sentence_steps) / len(sentence_steps), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--export", required=True, type=Path)
    parser.add_argument("--ct2-dir", type=Path, default=BENCH_DIR.parent / "build" / "ct2")
    parser.add_argument("--workload", default="strings")
    parser.add_argument("--batches", default="8,32,64")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--ct2-stop", action="store_true", help="also ours with CT2's stop")
    parser.add_argument("--split", type=int, help="time the parts of steps of about ROWS rows")
    args = parser.parse_args(argv)
    import ctranslate2

    from bench.ct2_convert import vocabulary
    from service.runtime.engine import Engine

    config = json.loads((args.export / "config.json").read_text())
    texts = sample(heldout_texts(config.get("source_lang", "en"), args.workload), args.sentences)
    sources = source_ids(args.export, texts)
    if args.split:
        print(json.dumps(split(args.export, sources, args.beam, args.split)))
        return 0
    vocab = vocabulary(args.model, config["vocab_size"])
    translator = ctranslate2.Translator(
        str(args.ct2_dir / args.model.name), device="cpu", intra_threads=1, inter_threads=1
    )
    engine = Engine.from_dir(args.export, provider="cpu", intra_op_threads=1)
    report: dict[str, Any] = {}
    for size in [int(x) for x in args.batches.split(",")]:
        plan = batches(sources, size)
        ours = [ours_counts(engine, [sources[i] for i in b], args.beam) for b in plan]
        theirs = [ct2_counts(translator, vocab, [sources[i] for i in b], args.beam) for b in plan]
        report[f"batch {size}"] = {"ours": summary(ours), "ct2": summary(theirs)}
        report[f"batch {size}"]["ours"]["rows_first_batch"] = ours[0]["rows"]
        report[f"batch {size}"]["ct2"]["rows_first_batch"] = theirs[0]["rows"]
        print(json.dumps({f"batch {size}": report[f"batch {size}"]}), flush=True)
        if args.ct2_stop:
            report[f"batch {size}"]["ours_outputs"] = [o for cell in ours for o in cell["outputs"]]
    if args.ct2_stop:
        patch_ct2_stop()
        for size in [int(x) for x in args.batches.split(",")]:
            plan = batches(sources, size)
            ours = [ours_counts(engine, [sources[i] for i in b], args.beam) for b in plan]
            before = report[f"batch {size}"].pop("ours_outputs")
            after = [o for cell in ours for o in cell["outputs"]]
            changed = sum(a != b for a, b in zip(before, after, strict=True))
            cell = {**summary(ours), "outputs_changed": changed, "of": len(after)}
            report[f"batch {size}"]["ours_ct2_stop"] = cell
            print(json.dumps({f"batch {size} ours with CT2's stop": cell}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
