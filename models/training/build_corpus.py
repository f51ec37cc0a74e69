"""Build the training corpus: v2's gettext catalogs (:mod:`models.training.corpus`) and v3's
general language (:mod:`models.training.general`), cleaned, deduplicated, split and written.

Usage::

    apt-get install -y apt-file && apt-file update     # once: Debian's Contents index
    python -m models.training.build_corpus --out build/corpus [--target-lang de] \
        [--parts catalogs,general] [--dict-ratio R]

The sources, the splits and the output format are described in :mod:`models.training.corpus`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from models.training import general
from models.training.corpus import (
    MAX_PACKAGE_MB,
    SPLIT_SEED,
    Pair,
    collect_pairs,
    deduplicate,
    packages_by_source,
    split_corpus,
    split_statistics,
    write_plain_text,
    write_tsv,
)

CATALOGS = "catalogs"
GENERAL = "general"
_WORD_RE = re.compile(r"\w+")


def leak_key(text: str) -> str:
    """A segment as a leak check compares it: its words, case-folded, without punctuation, so
    "Open the door!" leaks "open the door."."""
    return " ".join(_WORD_RE.findall(text.casefold()))


def without_leaks(train: list[Pair], evaluation: Iterable[Pair]) -> list[Pair]:
    """``train`` minus every pair whose source or target is a side of an evaluation pair (up to
    case and punctuation, :func:`leak_key`), so neither direction has seen an evaluation
    segment."""
    seen = {leak_key(text) for pair in evaluation for text in (pair.source, pair.target)}
    seen.discard("")
    return [
        pair
        for pair in train
        if leak_key(pair.source) not in seen and leak_key(pair.target) not in seen
    ]


def build_corpus(
    out_dir: Path,
    target_lang: str = "de",
    max_package_mb: float = MAX_PACKAGE_MB,
    parts: tuple[str, ...] = (CATALOGS,),
    dict_ratio: float | None = None,
) -> dict[str, object]:
    """Download, extract, clean, deduplicate, split and write the corpus; return the stats.

    ``parts``: ``catalogs`` (v2's gettext catalogs) and/or ``general`` (v3's dictionaries and
    translated documentation, :mod:`models.training.general`, German only). With ``general``,
    ``valid-prose``/``test-prose`` and ``valid-general``/``test-general`` (the dictionaries'
    example sentences) are written beside the catalog splits, and ``train`` takes the training
    prose, the other example sentences and ``dict_ratio`` dictionary entries per sentence
    pair."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drops: Counter[str] = Counter()
    raw_pairs: list[Pair] = []
    not_fetched: dict[str, str] = {}
    splits: dict[str, list[Pair]] = {"train": [], "valid": [], "test": [], "test-unseen": []}
    held_out: list[str] = []
    unique_pairs: list[Pair] = []
    if CATALOGS in parts:
        raw_pairs, not_fetched = collect_pairs(
            out_dir / "downloads", target_lang, drops, max_package_mb
        )
        unique_pairs = deduplicate(raw_pairs)
        splits, held_out = split_corpus(unique_pairs, packages_by_source(raw_pairs))
    extra: dict[str, object] = {}
    if GENERAL in parts:
        ratio = general.DEFAULT_DICT_RATIO if dict_ratio is None else dict_ratio
        by_kind, general_not_fetched = general.collect_general(
            out_dir / "downloads" / "general", drops
        )
        not_fetched.update(general_not_fetched)
        catalog_sources = {pair.source for pair in unique_pairs}
        prose = [p for p in deduplicate(by_kind[general.PROSE]) if p.source not in catalog_sources]
        prose_splits, prose_held_out = general.split_prose(prose)
        sentence_entries: list[Pair] = []
        phrase_entries: list[Pair] = []
        for pair in deduplicate(by_kind[general.DICTIONARY]):
            is_sentence = general.is_example_sentence(pair.source, pair.target)
            (sentence_entries if is_sentence else phrase_entries).append(pair)
        examples = [pair for pair in sentence_entries if pair.source not in catalog_sources]
        example_splits = general.split_examples(examples)
        for name in ("valid-prose", "test-prose"):
            splits[name] = prose_splits[name]
        for name in ("valid-general", "test-general"):
            splits[name] = example_splits[name]
        evaluation = [pair for name, split in splits.items() if name != "train" for pair in split]
        sentences = without_leaks(
            splits["train"] + prose_splits["train-prose"] + example_splits["train-examples"],
            evaluation,
        )
        known = {pair.source for pair in sentences}
        dictionary = without_leaks(
            [pair for pair in phrase_entries if pair.source not in known], evaluation
        )
        mixed = general.mix_dictionary(len(sentences), dictionary, ratio)
        splits["train"] = sentences + mixed
        extra = {
            "test_prose_packages": prose_held_out,
            "dict_ratio": ratio,
            "example_sentences": len(examples),
            "example_sentences_in_train": len(example_splits["train-examples"]),
            "dictionary_entries_available": len(dictionary),
            "dictionary_entries_mixed": len(mixed),
            "general_clean_pairs": {kind: len(pairs) for kind, pairs in by_kind.items()},
        }
    for split, split_pairs in splits.items():
        write_tsv(split_pairs, out_dir / f"{split}.tsv")
        write_plain_text(split_pairs, out_dir, split, target_lang)
    stats: dict[str, object] = {
        "target_lang": target_lang,
        "parts": list(parts),
        "seed": SPLIT_SEED,
        "clean_pairs_before_dedup": len(raw_pairs),
        "unique_sources": len(unique_pairs),
        "packages": len({pair.package for pair in raw_pairs}),
        "test_unseen_packages": held_out,
        **extra,
        "not_fetched": not_fetched,
        "dropped": dict(drops.most_common()),
        "all": split_statistics(unique_pairs),
        "splits": {split: split_statistics(split_pairs) for split, split_pairs in splits.items()},
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/corpus"))
    parser.add_argument("--target-lang", default="de")
    parser.add_argument(
        "--max-package-mb", type=float, default=MAX_PACKAGE_MB,
        help="skip Debian packages whose download is larger (listed in stats.json)",
    )  # fmt: skip
    parser.add_argument(
        "--parts", default=CATALOGS,
        help="comma-separated: catalogs (v2's gettext catalogs), general (v3's dictionaries "
        "and translated documentation); v3 is catalogs,general",
    )  # fmt: skip
    parser.add_argument(
        "--dict-ratio", type=float, default=None,
        help="dictionary entries per sentence pair in train (default: general.DEFAULT_DICT_RATIO)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    stats = build_corpus(
        args.out, args.target_lang, args.max_package_mb,
        tuple(args.parts.split(",")), args.dict_ratio,
    )  # fmt: skip
    summary = {split: s["pairs"] for split, s in stats["splits"].items()}  # type: ignore[index]
    print(
        json.dumps(
            {
                "unique_sources": stats["unique_sources"],
                "splits": summary,
                "not_fetched": len(stats["not_fetched"]),
            }
        )
    )  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
