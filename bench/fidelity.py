"""Does the service give back what the client wrote? Emoji, symbols, foreign names; and chrF.

    .venv/bin/python bench/fidelity.py --model build/onnx/default [--corpus build/corpus]
        [--code DIR] [--label after] [--beams 1,4]

1. **Inserted characters.** Every held-out desktop-application string of
   ``loadtest/inputs.py`` (``UI_STRINGS``) with two words or more gets one emoji, symbol or
   foreign-script name (``INSERTS``, in turn) between two of its words (position drawn with a
   fixed seed), and goes through ``POST /v1/translate`` of the real app (in process, httpx
   ASGI transport, real batcher and ONNX Runtime engine). A string counts as intact when its
   translation contains the inserted sequence as often as the input does.
2. **chrF/BLEU** (sacrebleu) of ``test.tsv`` in ``--corpus`` through the same service, so a
   change of masking can be checked for a quality cost. Also the sources whose translation
   changed between two runs can be compared with ``--compare before.json``.

``--code DIR`` imports ``service`` from another checkout (e.g. ``git archive <commit>``
unpacked), to measure the code before a change with the same script and inputs. Writes JSON to
``bench/results/fidelity-<label>.json``; not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INSERTS: tuple[str, ...] = (
    "😀", "✔", "→", "©", "Ω", "東京", "Дмитрий", "Zoë", "№", "👍🏽", "ℹ️", "🇩🇪", "👨‍👩‍👧",
    "€", "—", "™", "★", "⚠️", "Łódź", "محمد", "서울", "Ἀθῆναι", "°C", "½", "✓", "🔒",
)  # fmt: skip
SEED = 16


def inserted_strings(strings: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(text, insert)``: each string of two words or more with one insert between words."""
    rng = random.Random(SEED)
    cases = []
    for string in strings:
        words = string.split(" ")
        if len(words) < 2:
            continue
        insert = INSERTS[len(cases) % len(INSERTS)]
        position = rng.randrange(1, len(words))
        cases.append((" ".join([*words[:position], insert, *words[position:]]), insert))
    return cases


async def translate_all(client, texts: list[str], beam_size: int, chunk: int = 32) -> list[str]:
    translations: list[str] = []
    for start in range(0, len(texts), chunk):
        response = await client.post(
            "/v1/translate", json={"text": texts[start : start + chunk], "beam_size": beam_size}
        )
        response.raise_for_status()
        translations += [t["text"] for t in response.json()["translations"]]
    return translations


async def measure(args: argparse.Namespace) -> dict:
    import httpx
    import sacrebleu

    from loadtest.inputs import UI_STRINGS
    from service.config import Settings
    from service.wiring import create_app

    settings = Settings(
        exports=[args.model],
        provider="cpu",
        intra_op_threads=args.threads,
        translation_cache_size=0,
        max_queue=4096,
    )
    app = create_app(settings)
    cases = inserted_strings(UI_STRINGS)
    result: dict = {"label": args.label, "code": str(args.code), "model": str(args.model)}
    async with app.router.lifespan_context(app):
        while app.state.service.phase == "loading":
            await asyncio.sleep(0.05)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mt", timeout=600) as c:
            for beam_size in args.beams:
                texts = [text for text, _ in cases]
                started = time.perf_counter()
                translations = await translate_all(c, texts, beam_size)
                seconds = time.perf_counter() - started
                rows = [
                    {"text": text, "insert": insert, "translation": translation}
                    for (text, insert), translation in zip(cases, translations, strict=True)
                ]
                intact = [row["translation"].count(row["insert"]) >= 1 for row in rows]
                per_insert: dict[str, list[int]] = {}
                for row, ok in zip(rows, intact, strict=True):
                    per_insert.setdefault(row["insert"], [0, 0])
                    per_insert[row["insert"]][0] += ok
                    per_insert[row["insert"]][1] += 1
                result[f"inserts_beam{beam_size}"] = {
                    "strings": len(rows),
                    "intact": sum(intact),
                    "intact_percent": round(100 * sum(intact) / len(rows), 2),
                    "seconds": round(seconds, 2),
                    "per_insert": {k: f"{ok}/{n}" for k, (ok, n) in per_insert.items()},
                    "lost": [row for row, ok in zip(rows, intact, strict=True) if not ok],
                    "examples": rows[:: max(1, len(rows) // 10)],
                }
            if args.corpus is not None:
                pairs = [
                    line.split("\t")
                    for line in (args.corpus / "test.tsv").read_text().split("\n")[1:]
                    if line
                ]
                sources = [pair[0] for pair in pairs]
                references = [pair[1] for pair in pairs]
                for beam_size in args.beams:
                    started = time.perf_counter()
                    hypotheses = await translate_all(c, sources, beam_size, chunk=64)
                    result[f"corpus_beam{beam_size}"] = {
                        "pairs": len(pairs),
                        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
                        "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
                        "seconds": round(time.perf_counter() - started, 1),
                        "hypotheses": hypotheses,
                    }
                result["corpus_references"] = references
                result["corpus_sources"] = sources
    return result


def compare(result: dict, before: dict) -> dict:
    """chrF of the test sentences whose translation changed, before and after."""
    import sacrebleu

    comparison = {}
    for key in [k for k in result if k.startswith("corpus_beam") and k in before]:
        now, then = result[key]["hypotheses"], before[key]["hypotheses"]
        changed = [i for i, (a, b) in enumerate(zip(now, then, strict=True)) if a != b]
        refs = [result["corpus_references"][i] for i in changed]
        comparison[key] = {
            "changed": len(changed),
            "chrf_changed_before": round(
                sacrebleu.corpus_chrf([then[i] for i in changed], [refs]).score, 2
            )
            if changed
            else None,
            "chrf_changed_after": round(
                sacrebleu.corpus_chrf([now[i] for i in changed], [refs]).score, 2
            )
            if changed
            else None,
            "examples": [
                {
                    "source": result["corpus_sources"][i],
                    "reference": result["corpus_references"][i],
                    "before": then[i],
                    "after": now[i],
                }
                for i in changed[:15]
            ],
        }
    return comparison


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=ROOT / "build/onnx/default")
    parser.add_argument("--corpus", type=Path, default=None, help="directory with test.tsv")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout to import service from")
    parser.add_argument("--label", default="after")
    parser.add_argument("--beams", type=lambda s: [int(b) for b in s.split(",")], default=[1, 4])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", type=Path, default=None, help="an earlier run's JSON")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve()))
    sys.path.append(str(ROOT))  # loadtest/ (the same inputs whatever --code is)
    from loadtest.machine import machine_facts

    result = asyncio.run(measure(args))
    result["machine"] = machine_facts()
    if args.compare is not None:
        result["compare"] = compare(result, json.loads(args.compare.read_text()))
    output = args.output or ROOT / "bench" / "results" / f"fidelity-{args.label}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    for key, value in result.items():
        if key.startswith("inserts_"):
            print(
                f"{args.label} {key}: {value['intact']}/{value['strings']} intact "
                f"({value['intact_percent']} %), {value['seconds']} s"
            )
        elif key.startswith("corpus_beam"):
            print(f"{args.label} {key}: chrF {value['chrf']} BLEU {value['bleu']} "
                  f"({value['pairs']} pairs, {value['seconds']} s)")  # fmt: skip
    for key, value in result.get("compare", {}).items():
        print(
            f"{key}: {value['changed']} translations changed; chrF of those "
            f"{value['chrf_changed_before']} before -> {value['chrf_changed_after']} after"
        )
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
