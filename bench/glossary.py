"""What glossaries do to real translations: term accuracy, chrF with and without, and the
latency a glossary adds to a request.

    .venv/bin/python bench/glossary.py --model build/onnx/default [--corpus build/corpus]
        [--limit N] [--beam 1] [--label after]

The sentences are the held-out ``test.tsv`` of the corpus the shipped models were trained on
(models/training/corpus.py; English->German, its columns swapped for a model whose source is
German). Each source is word-aligned with its reference by eflomal (the test pairs aligned
together with up to ``--align-with`` training pairs for better statistics; links kept where
both directions agree), and each request gets a random glossary of 3 to 5 terms: aligned
(source word, reference word) pairs of that sentence, both words alphabetic and at least
``--min-chars`` long, topped up with terms of other sentences (which a real glossary holds
too, and which must not appear). Terms inside markup or format fields are not drawn.

Every sentence is translated twice through ``POST /v1/translate`` of the real app (in
process, real batcher and ONNX Runtime engine, cache off), one request at a time, with and
without its glossary, alternating, so that both see the same machine state:

* **term accuracy**: of the (sentence, term) pairs whose source term occurs in the source
  (counted independently here: case-insensitive, whole words, outside placeholders), the
  share whose target term appears in the translation, spelled exactly and as a whole word,
  at least as often; ``exact`` also requires no more often (the model may write the word on
  its own as well);
* **chrF** (sacrebleu) of both runs against the references, over all sentences and over
  those with a matched term; the difference is what writing the exact, uninflected target
  term costs or gains;
* **latency** of the requests with and without a glossary (mean, median, p95) and the
  median of the per-sentence differences.

Writes JSON to ``bench/results/glossary-<label>.json``. Timed: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import regex

ROOT = Path(__file__).resolve().parents[1]
SEED = 31
WORD = regex.compile(r"\w+")


def read_pairs(corpus: Path, split: str, reverse: bool) -> list[tuple[str, str]]:
    """``(source, reference)`` of a corpus split (a header line, then TAB-separated rows)."""
    rows = (corpus / f"{split}.tsv").read_text(encoding="utf-8").split("\n")[1:]
    pairs = [tuple(row.split("\t")[:2]) for row in rows if row]
    return [(b, a) if reverse else (a, b) for a, b in pairs]  # type: ignore[misc]


def words(text: str) -> list[regex.Match[str]]:
    return list(WORD.finditer(text))


def align(pairs: list[tuple[str, str]]) -> list[set[tuple[int, int]]]:
    """Word links ``(source word index, reference word index)`` per pair, where eflomal's
    forward and reverse alignments agree."""
    import eflomal

    sources = [" ".join(m.group().lower() for m in words(s)) or "_" for s, _ in pairs]
    targets = [" ".join(m.group().lower() for m in words(t)) or "_" for _, t in pairs]
    with tempfile.TemporaryDirectory() as tmp:
        forward, reverse = os.path.join(tmp, "fwd"), os.path.join(tmp, "rev")
        eflomal.Aligner().align(
            sources, targets, links_filename_fwd=forward, links_filename_rev=reverse
        )
        links = []
        with open(forward) as fwd, open(reverse) as rev:
            for line_f, line_r in zip(fwd, rev, strict=True):
                both = set(line_f.split()) & set(line_r.split())
                links.append({tuple(map(int, link.split("-"))) for link in both})
    return links  # type: ignore[return-value]


def outside_markup(text: str) -> str:
    """``text`` with its placeholders (tags, format fields, URLs: what the service protects
    and never matches a term in) blanked out."""
    from service.text.placeholders import find_placeholders

    chars = list(text)
    for start, end in find_placeholders(text):
        chars[start:end] = " " * (end - start)
    return "".join(chars)


def occurrences(term: str, text: str, ignore_case: bool = True) -> int:
    """Whole-word occurrences of ``term`` in ``text``."""
    flags = regex.IGNORECASE if ignore_case else 0
    return len(regex.findall(rf"(?<!\w){regex.escape(term)}(?!\w)", text, flags))


def candidate_terms(
    pairs: list[tuple[str, str]], links: list[set[tuple[int, int]]], min_chars: int
) -> list[list[tuple[str, str]]]:
    """Per pair, the aligned ``(source word, reference word)`` terms a glossary may hold:
    one-to-one links, both words alphabetic and ``min_chars`` long, the source word outside
    markup."""
    candidates = []
    for (source, reference), pair_links in zip(pairs, links, strict=True):
        source_words, reference_words = words(source), words(reference)
        out_degree: dict[int, int] = {}
        in_degree: dict[int, int] = {}
        for i, j in pair_links:
            out_degree[i] = out_degree.get(i, 0) + 1
            in_degree[j] = in_degree.get(j, 0) + 1
        visible = outside_markup(source)
        terms: dict[str, str] = {}
        for i, j in sorted(pair_links):
            if out_degree[i] > 1 or in_degree[j] > 1:
                continue
            if i >= len(source_words) or j >= len(reference_words):
                continue
            src, ref = source_words[i].group(), reference_words[j].group()
            ok = all(w.isalpha() and len(w) >= min_chars for w in (src, ref))
            if ok and occurrences(src, visible) and src.lower() not in terms:
                terms[src.lower()] = ref
        candidates.append(list(terms.items()))
    return candidates


def draw_glossaries(
    candidates: list[list[tuple[str, str]]], rng: random.Random
) -> list[dict[str, str] | None]:
    """A 3-5 term glossary per sentence: its own aligned terms first, then others'; None for
    a sentence without an aligned term."""
    pool = sorted({term for terms in candidates for term in terms})
    glossaries: list[dict[str, str] | None] = []
    for terms in candidates:
        if not terms:
            glossaries.append(None)
            continue
        size = rng.randint(3, 5)
        chosen = dict(rng.sample(terms, min(size, len(terms))))
        for source, target in rng.sample(pool, min(len(pool), 4 * size)):
            if len(chosen) >= size:
                break
            chosen.setdefault(source, target)
        glossaries.append(chosen)
    return glossaries


async def translate(client, text: str, beam: int, glossary: dict[str, str] | None):
    body: dict = {"text": text, "beam_size": beam, "use_memory": False}
    if glossary is not None:
        body["glossary"] = glossary
    started = time.perf_counter()
    response = await client.post("/v1/translate", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    return response.json()["translations"][0]["text"], seconds


def latency_summary(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {
        "mean_ms": round(1000 * statistics.fmean(ordered), 2),
        "median_ms": round(1000 * statistics.median(ordered), 2),
        "p95_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
    }


async def measure(args: argparse.Namespace) -> dict:
    import httpx
    import sacrebleu

    from service.config import Settings
    from service.wiring import create_app

    config = json.loads((args.model / "config.json").read_text())
    reverse = config.get("source_lang", "en") != "en"  # the corpus is English -> German
    pairs = read_pairs(args.corpus, args.split, reverse)[: args.limit or None]
    extra: list[tuple[str, str]] = []
    if args.align_with and (args.corpus / "train.tsv").exists():
        extra = read_pairs(args.corpus, "train", reverse)[: args.align_with]
    links = align(pairs + extra)[: len(pairs)]
    rng = random.Random(SEED)
    glossaries = draw_glossaries(candidate_terms(pairs, links, args.min_chars), rng)
    chosen = [i for i, glossary in enumerate(glossaries) if glossary is not None]

    settings = Settings(
        exports=[args.model],
        provider="cpu",
        intra_op_threads=args.threads,
        translation_cache_size=0,
        max_glossary_entries=16,
        data_dir=Path(tempfile.mkdtemp(prefix="glossary-bench-")),
    )
    app = create_app(settings)
    rows = []
    async with app.router.lifespan_context(app):
        while app.state.service.phase == "loading":
            await asyncio.sleep(0.05)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mt", timeout=600) as c:
            await translate(c, pairs[0][0], args.beam, None)  # warm the route
            for n, index in enumerate(chosen):
                source, reference = pairs[index]
                glossary = glossaries[index]
                # Alternate which goes first, so neither always follows the other.
                if n % 2:
                    plain, plain_s = await translate(c, source, args.beam, None)
                    termed, termed_s = await translate(c, source, args.beam, glossary)
                else:
                    termed, termed_s = await translate(c, source, args.beam, glossary)
                    plain, plain_s = await translate(c, source, args.beam, None)
                rows.append(
                    {
                        "source": source,
                        "reference": reference,
                        "glossary": glossary,
                        "without": plain,
                        "with": termed,
                        "without_s": plain_s,
                        "with_s": termed_s,
                    }
                )

    terms_checked = exact = at_least = 0
    failures = []
    for row in rows:
        visible = outside_markup(row["source"])
        matched = False
        for source_term, target_term in row["glossary"].items():
            expected = occurrences(source_term, visible)
            if not expected:
                continue
            matched = True
            got = occurrences(target_term, row["with"], ignore_case=False)
            terms_checked += 1
            at_least += got >= expected
            exact += got == expected
            if got < expected:
                failures.append({**row, "term": [source_term, target_term], "expected": expected})
        row["matched"] = matched

    def chrf(hypotheses: list[str], references: list[str]) -> float | None:
        if not hypotheses:
            return None
        return round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2)

    matched_rows = [row for row in rows if row["matched"]]
    references = [row["reference"] for row in rows]
    differences = [row["with_s"] - row["without_s"] for row in rows]
    return {
        "label": args.label,
        "model": str(args.model),
        "corpus": str(args.corpus / f"{args.split}.tsv"),
        "beam_size": args.beam,
        "sentences": len(pairs),
        "sentences_with_glossary": len(rows),
        "terms_checked": terms_checked,
        "term_accuracy_percent": round(100 * at_least / terms_checked, 2)
        if terms_checked
        else None,
        "term_exact_count_percent": round(100 * exact / terms_checked, 2)
        if terms_checked
        else None,
        "chrf_without": chrf([row["without"] for row in rows], references),
        "chrf_with": chrf([row["with"] for row in rows], references),
        "matched_sentences": len(matched_rows),
        "chrf_without_matched": chrf(
            [row["without"] for row in matched_rows], [row["reference"] for row in matched_rows]
        ),
        "chrf_with_matched": chrf(
            [row["with"] for row in matched_rows], [row["reference"] for row in matched_rows]
        ),
        "latency_without": latency_summary([row["without_s"] for row in rows]) if rows else None,
        "latency_with": latency_summary([row["with_s"] for row in rows]) if rows else None,
        "latency_added_median_ms": round(1000 * statistics.median(differences), 2)
        if rows
        else None,
        "failures": failures[:50],
        "examples": rows[:: max(1, len(rows) // 20)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=ROOT / "build/onnx/default")
    parser.add_argument("--corpus", type=Path, default=ROOT / "build/corpus")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences (0: all)")
    parser.add_argument("--align-with", type=int, default=50_000, help="training pairs")
    parser.add_argument("--min-chars", type=int, default=4)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="after")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if not (args.corpus / f"{args.split}.tsv").exists():
        sys.exit(f"{args.corpus / args.split}.tsv not found: build the corpus (see MODEL_CARD.md)")
    sys.path.insert(0, str(ROOT))
    from loadtest.machine import machine_facts

    result = asyncio.run(measure(args))
    result["machine"] = machine_facts()
    output = args.output or ROOT / "bench" / "results" / f"glossary-{args.label}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(
        f"{args.label}: {result['sentences_with_glossary']} of {result['sentences']} sentences "
        f"with a glossary, {result['terms_checked']} terms matched: term accuracy "
        f"{result['term_accuracy_percent']} % (exact count {result['term_exact_count_percent']} "
        f"%); chrF {result['chrf_without']} without -> {result['chrf_with']} with "
        f"(matched sentences: {result['chrf_without_matched']} -> "
        f"{result['chrf_with_matched']}); latency added per request (median) "
        f"{result['latency_added_median_ms']} ms"
    )
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
