"""Tokenize the training split into compact arrays that travel to a GPU machine.

    python -m models.training.arrays --corpus build/corpus-v3 --out build/arrays-v3 \\
        [--part-mb 15] [--max-len 128]

A GPU session has minutes, not the time to tokenize a million pairs, and what travels with it
is counted in megabytes. So the training pairs go as token ids: ``uint16`` (the vocabulary has
8,000 ids) in parts of at most ``--part-mb`` each:

* ``train-NNN.tokens.npy``: for every pair its English ids then its German ids (each ending in
  ``</s>``), pairs one after the other;
* ``train-NNN.index.npy``: ``uint16 (pairs, 3)``: English length, German length, and the
  pair's kind (:data:`KINDS`: catalog string, prose sentence, dictionary entry, dictionary
  example sentence), so a run can
  weight or leave out a kind without re-tokenizing;
* ``manifest.json``: the parts with their pairs and SHA-256, the tokenizer's hash, the limits.

Placeholders are masked as at serving time (``service.text.placeholders.mask_pair``); pairs
longer than ``--max-len`` tokens on either side are left out (and counted). The validation
splits travel as text beside them (``valid.tsv``, ``valid-prose.tsv``, ``valid-general.tsv``:
validation decodes
text through the service's pipeline), with the tokenizer, so the folder is all a run needs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.training.corpus import Pair, read_tsv
from models.training.general import DICTIONARY, EXAMPLE, PROSE, SOURCES, is_example_sentence
from service.text.placeholders import mask_pair
from service.text.tokenizer import Tokenizer

CATALOG = "catalog"
KINDS = (CATALOG, PROSE, DICTIONARY, EXAMPLE)
"""Kind codes of the index arrays: position in this tuple."""
DEFAULT_PART_MB = 15.0
"""A part comes back from (and goes to) the GPU machine as one file: 16 MiB at most."""
MANIFEST = "manifest.json"
EVAL_SPLITS = ("valid.tsv", "valid-prose.tsv", "valid-general.tsv")
TOKENS_DTYPE = np.uint16


@dataclass
class Examples:
    """Token ids of every pair, flat: ``tokens[starts[i]:starts[i]+src_lens[i]]`` is pair
    ``i``'s English, the ``tgt_lens[i]`` ids after it its German."""

    tokens: np.ndarray
    starts: np.ndarray
    src_lens: np.ndarray
    tgt_lens: np.ndarray
    kinds: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def pair(self, index: int, reverse: bool = False) -> tuple[list[int], list[int]]:
        start, src_len, tgt_len = (
            int(self.starts[index]), int(self.src_lens[index]), int(self.tgt_lens[index]),
        )  # fmt: skip
        english = self.tokens[start : start + src_len].tolist()
        german = self.tokens[start + src_len : start + src_len + tgt_len].tolist()
        return (german, english) if reverse else (english, german)


_GENERAL_KINDS = {f"debian:{source.package}": source.kind for source in SOURCES}


def kind_of(pair: Pair) -> str:
    kind = _GENERAL_KINDS.get(pair.package, CATALOG)
    if kind == DICTIONARY and is_example_sentence(pair.source, pair.target):
        return EXAMPLE
    return kind


def write_parts(
    pairs: list[tuple[list[int], list[int], int]], out: Path, part_bytes: int
) -> list[dict[str, object]]:
    """Write ``(english ids, german ids, kind code)`` pairs as parts of at most
    ``part_bytes`` tokens each; returns the manifest's part entries."""
    out.mkdir(parents=True, exist_ok=True)
    parts: list[dict[str, object]] = []
    itemsize = np.dtype(TOKENS_DTYPE).itemsize
    start = 0
    while start < len(pairs):
        size, end = 0, start
        while end < len(pairs) and (
            end == start
            or size + (len(pairs[end][0]) + len(pairs[end][1])) * itemsize <= part_bytes
        ):
            size += (len(pairs[end][0]) + len(pairs[end][1])) * itemsize
            end += 1
        chunk = pairs[start:end]
        tokens = np.fromiter(
            (token for english, german, _ in chunk for token in (*english, *german)),
            dtype=TOKENS_DTYPE,
        )
        index = np.array([(len(e), len(g), kind) for e, g, kind in chunk], dtype=TOKENS_DTYPE)
        name = f"train-{len(parts):03d}"
        np.save(out / f"{name}.tokens.npy", tokens)
        np.save(out / f"{name}.index.npy", index.reshape(-1, 3))
        parts.append(
            {
                "name": name,
                "pairs": len(chunk),
                "tokens": int(tokens.size),
                "sha256": _sha256(out / f"{name}.tokens.npy", out / f"{name}.index.npy"),
            }
        )
        start = end
    return parts


def _sha256(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def load_examples(arrays: Path, kinds: tuple[str, ...] = KINDS, verify: bool = True) -> Examples:
    """Every pair of every part listed in the manifest (of the wanted kinds)."""
    manifest = json.loads((arrays / MANIFEST).read_text())
    tokens, index = [], []
    for part in manifest["parts"]:
        token_path = arrays / f"{part['name']}.tokens.npy"
        index_path = arrays / f"{part['name']}.index.npy"
        if verify and _sha256(token_path, index_path) != part["sha256"]:
            raise ValueError(f"{part['name']}: SHA-256 differs from the manifest")
        tokens.append(np.load(token_path))
        index.append(np.load(index_path).reshape(-1, 3))
    all_tokens = np.concatenate(tokens) if tokens else np.zeros(0, TOKENS_DTYPE)
    all_index = np.concatenate(index).astype(np.int64) if index else np.zeros((0, 3), np.int64)
    lengths = all_index[:, 0] + all_index[:, 1]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    keep = np.isin(all_index[:, 2], [KINDS.index(kind) for kind in kinds])
    return Examples(
        all_tokens, starts[keep], all_index[keep, 0], all_index[keep, 1], all_index[keep, 2]
    )


def encode_pairs(
    pairs: list[Pair], tokenizer: Tokenizer, max_len: int
) -> tuple[list[tuple[list[int], list[int], int]], int]:
    """Masked, tokenized ``(english, german, kind)``; and how many pairs were too long."""
    masked = [mask_pair(pair.source, pair.target)[:2] for pair in pairs]
    english = tokenizer.encode([source for source, _ in masked])
    german = tokenizer.encode([target for _, target in masked])
    encoded, too_long = [], 0
    for pair, english_ids, german_ids in zip(pairs, english, german, strict=True):
        if len(english_ids) > max_len or len(german_ids) > max_len:
            too_long += 1
            continue
        encoded.append((english_ids, german_ids, KINDS.index(kind_of(pair))))
    return encoded, too_long


def build_arrays(corpus: Path, out: Path, part_mb: float, max_len: int) -> dict[str, object]:
    tokenizer = Tokenizer.from_dir(corpus / "tokenizer")
    vocab_size = len(json.loads((corpus / "tokenizer" / "vocab.json").read_text()))
    if vocab_size > np.iinfo(TOKENS_DTYPE).max + 1:
        raise ValueError(f"a vocabulary of {vocab_size} ids does not fit {TOKENS_DTYPE.__name__}")
    encoded, too_long = encode_pairs(read_tsv(corpus / "train.tsv"), tokenizer, max_len)
    if out.exists():
        shutil.rmtree(out)
    parts = write_parts(encoded, out, int(part_mb * 1e6))
    shutil.copytree(corpus / "tokenizer", out / "tokenizer")
    for split in EVAL_SPLITS:
        if (corpus / split).exists():
            shutil.copy(corpus / split, out / split)
    manifest: dict[str, object] = {
        "format": 1,
        "dtype": np.dtype(TOKENS_DTYPE).name,
        "kinds": list(KINDS),
        "vocab_size": vocab_size,
        "tokenizer_sha256": _sha256(corpus / "tokenizer" / "source.spm"),
        "max_len": max_len,
        "pairs": len(encoded),
        "pairs_too_long": too_long,
        "pairs_by_kind": {kind: sum(e[2] == KINDS.index(kind) for e in encoded) for kind in KINDS},
        "parts": parts,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus-v3"))
    parser.add_argument("--out", type=Path, default=Path("build/arrays-v3"))
    parser.add_argument("--part-mb", type=float, default=DEFAULT_PART_MB)
    parser.add_argument("--max-len", type=int, default=128)
    args = parser.parse_args(argv)
    manifest = build_arrays(args.corpus, args.out, args.part_mb, args.max_len)
    json.dump({key: value for key, value in manifest.items() if key != "parts"}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
