"""Evaluate a model on the corpus test split: chrF and BLEU (sacrebleu) beside a copy-the-source
baseline, placeholder survival, and example translations.

    python -m models.training.evaluate --model models/default --corpus build/corpus [--beam-size 4]

Translation goes through the same placeholder protection as the service. The printed scores are
the ones MODEL_CARD.md quotes; the JSON lands in ``--output``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import sacrebleu
import torch

from models.checkpoint import load_pretrained
from models.search import beam_search, greedy_search
from models.training.corpus import read_tsv
from models.transformer import Transformer
from service.placeholders import placeholder_strings, protect, restore, survival_rate
from service.tokenizer import Tokenizer


def translate_with(
    decode_ids: Callable[[list[list[int]], int], list[list[int]]],
    tokenizer: Tokenizer,
    texts: list[str],
    batch_size: int = 64,
) -> list[str]:
    """Protect placeholders, tokenize, decode in length-sorted batches, detokenize, restore.

    ``decode_ids(src_ids, max_new_tokens)`` is the backend: the PyTorch reference search or the
    ONNX Runtime engine, so both are scored through exactly the same text handling.
    """
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    translated: dict[int, str] = {}
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        protected = [protect(texts[i]) for i in indices]
        ids = tokenizer.encode([masked for masked, _ in protected])
        max_new_tokens = int(max(len(row) for row in ids) * 1.5) + 10
        hypotheses = decode_ids(ids, max_new_tokens)
        for index, tokens, (_, originals) in zip(indices, hypotheses, protected, strict=True):
            translated[index] = restore(tokenizer.decode(tokens), originals)
    return [translated[i] for i in range(len(texts))]


def torch_decoder(
    model: Transformer, beam_size: int = 1
) -> Callable[[list[list[int]], int], list[list[int]]]:
    """The PyTorch reference search as a ``decode_ids`` backend."""
    config = model.config

    def decode_ids(ids: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        model.eval()
        src_ids = torch.full((len(ids), max(len(row) for row in ids)), config.pad_id)
        for row, row_ids in enumerate(ids):
            src_ids[row, : len(row_ids)] = torch.tensor(row_ids)
        src_mask = (src_ids != config.pad_id).long()
        max_new_tokens = min(max_new_tokens, config.max_positions - 1)
        if beam_size == 1:
            return greedy_search(model, src_ids, src_mask, max_new_tokens=max_new_tokens)
        return beam_search(
            model, src_ids, src_mask, beam_size=beam_size, max_new_tokens=max_new_tokens
        )

    return decode_ids


def translate(
    model: Transformer, tokenizer: Tokenizer, texts: list[str], beam_size: int = 1
) -> list[str]:
    """Translate with the PyTorch reference (used for validation during training)."""
    return translate_with(torch_decoder(model, beam_size), tokenizer, texts)


def evaluate(
    model_dir: Path,
    corpus: Path,
    beam_size: int,
    limit: int | None,
    onnx_dir: Path | None,
    constrain_placeholders: bool = False,
) -> dict:
    if onnx_dir is None:
        tokenizer = Tokenizer.from_dir(model_dir)
        decode_ids = torch_decoder(load_pretrained(model_dir), beam_size)
    else:
        from service.engine import Engine
        from service.text_pipeline import copy_tokens_for, placeholder_token_ids

        engine = Engine.from_dir(onnx_dir, provider="cpu")
        tokenizer = engine.tokenizer
        # The service's placeholder constraint (service/decoding.py, CopyConstraint).
        symbol_ids = placeholder_token_ids(tokenizer) if constrain_placeholders else frozenset()

        def decode_ids(ids: list[list[int]], max_new_tokens: int) -> list[list[int]]:
            copy_tokens = [copy_tokens_for(row, symbol_ids) for row in ids]
            return engine.translate_ids(
                ids, beam_size=beam_size, max_new_tokens=max_new_tokens, copy_tokens=copy_tokens
            )

    pairs = read_tsv(corpus / "test.tsv")[:limit]
    sources, references = [p.source for p in pairs], [p.target for p in pairs]
    started = time.perf_counter()
    hypotheses = translate_with(decode_ids, tokenizer, sources)
    seconds = time.perf_counter() - started
    with_placeholders = [i for i, source in enumerate(sources) if placeholder_strings(source)]
    return {
        "model": str(model_dir),
        "backend": "pytorch" if onnx_dir is None else f"onnxruntime ({onnx_dir})",
        "placeholder_constraint": onnx_dir is not None and constrain_placeholders,
        "test_pairs": len(pairs),
        "beam_size": beam_size,
        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
        "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
        "copy_baseline_chrf": round(sacrebleu.corpus_chrf(sources, [references]).score, 2),
        "copy_baseline_bleu": round(sacrebleu.corpus_bleu(sources, [references]).score, 2),
        "pairs_with_placeholders": len(with_placeholders),
        "placeholder_survival": round(
            survival_rate(
                [sources[i] for i in with_placeholders], [hypotheses[i] for i in with_placeholders]
            ),
            4,
        ),
        "seconds": round(seconds, 1),
        "examples": [
            {"source": sources[i], "reference": references[i], "translation": hypotheses[i]}
            for i in range(0, len(pairs), max(1, len(pairs) // 12))
        ][:12],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/default"))
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus"))
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument(
        "--onnx",
        type=Path,
        default=None,
        help="score this ONNX export with the serving engine instead of PyTorch",
    )
    parser.add_argument(
        "--constrain-placeholders",
        action="store_true",
        help="with --onnx: decode with the service's placeholder constraint",
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="evaluate on the first N test pairs only"
    )
    parser.add_argument("--output", type=Path, default=Path("build/eval/scores.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = evaluate(
        args.model,
        args.corpus,
        args.beam_size,
        args.limit,
        args.onnx,
        args.constrain_placeholders,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    for example in result["examples"]:
        print(
            f"EN  {example['source']}\nREF {example['reference']}\nOUT {example['translation']}\n"
        )
    print(json.dumps({key: value for key, value in result.items() if key != "examples"}, indent=2))


if __name__ == "__main__":
    main()
