"""Evaluate a model on the corpus test split: chrF and BLEU (sacrebleu) beside a copy-the-source
baseline, placeholder survival, and example translations.

    python -m models.training.evaluate --model models/default --corpus build/corpus [--beam-size 4]

Translation goes through the service's own text pipeline (service/text/pipeline.py): the same
sentence splitting, placeholder masking, tag edges, per-sentence token limit and output budget
(``MT_OUTPUT_LENGTH_RATIO`` x source tokens + ``MT_OUTPUT_LENGTH_SLACK``, at most
``MT_MAX_NEW_TOKENS``) and reassembly, so what is scored is what is served. A text the service
would refuse (413: a sentence over ``MT_MAX_INPUT_TOKENS``) scores as an empty translation and
is counted. The printed scores are the ones MODEL_CARD.md quotes; the JSON lands in
``--output``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from models.checkpoint import load_pretrained
from models.search import beam_search, greedy_search
from models.training.corpus import read_direction
from models.transformer import Transformer
from service.config import Settings
from service.errors import InputTooLarge
from service.text.pipeline import TextPipeline
from service.text.placeholders import placeholder_strings, survival_rate
from service.text.plans import TextPlan
from service.text.tokenizer import Tokenizer

# The backend: source ids, each row's token budget and placeholder constraint -> output ids.
DecodeIds = Callable[[list[list[int]], list[int], list[dict[int, int] | None]], list[list[int]]]


def translate_with(
    decode_ids: DecodeIds,
    tokenizer: Tokenizer,
    texts: list[str],
    batch_size: int = 64,
    source_lang: str = "en",
    model_positions: int | None = None,
) -> tuple[list[str], int]:
    """Translate ``texts`` through the service's text pipeline; sentences decode in
    length-sorted batches. Returns the translations and how many texts the service would
    refuse (those come back empty).

    ``decode_ids`` is the backend: the PyTorch reference search or the ONNX Runtime engine, so
    both are scored through exactly the same text handling.
    """
    pipeline = TextPipeline(tokenizer, Settings().limits, source_lang, model_positions)
    options = pipeline.limits.options(None, None)  # the output budget; the backend does the search
    plans: list[list[TextPlan] | None] = []
    for text in texts:
        try:
            plans.append(pipeline.plan([text], options))
        except InputTooLarge:
            plans.append(None)
    sentences = [
        sentence
        for text_plans in plans
        if text_plans is not None
        for plan in text_plans
        for sentence in plan.sentences
        if sentence.needs_model
    ]
    sentences.sort(key=lambda sentence: len(sentence.src_ids))
    for start in range(0, len(sentences), batch_size):
        batch = sentences[start : start + batch_size]
        outputs = decode_ids(
            [list(sentence.src_ids) for sentence in batch],
            [sentence.max_new_tokens for sentence in batch],
            [sentence.copy_tokens for sentence in batch],
        )
        for sentence, output_ids in zip(batch, outputs, strict=True):
            pipeline.finish(sentence, output_ids)
    translations = [
        pipeline.assemble(text_plans, decoded=0).translations[0].text if text_plans else ""
        for text_plans in plans
    ]
    return translations, sum(text_plans is None for text_plans in plans)


def torch_decoder(model: Transformer, beam_size: int = 1) -> DecodeIds:
    """The PyTorch reference search as a backend (no placeholder constraint). A batch decodes
    to its largest budget and each row is cut to its own: the same tokens for greedy search;
    for beam search, rows whose budget is below the batch's may end differently."""
    config = model.config

    def decode_ids(
        ids: list[list[int]], budgets: list[int], _: list[dict[int, int] | None]
    ) -> list[list[int]]:
        model.eval()
        src_ids = torch.full((len(ids), max(len(row) for row in ids)), config.pad_id)
        for row, row_ids in enumerate(ids):
            src_ids[row, : len(row_ids)] = torch.tensor(row_ids)
        src_ids = src_ids.to(next(model.parameters()).device)
        src_mask = (src_ids != config.pad_id).long()
        max_new_tokens = min(max(budgets), config.max_positions - 1)
        if beam_size == 1:
            outputs = greedy_search(model, src_ids, src_mask, max_new_tokens=max_new_tokens)
        else:
            outputs = beam_search(
                model, src_ids, src_mask, beam_size=beam_size, max_new_tokens=max_new_tokens
            )
        return [output[:budget] for output, budget in zip(outputs, budgets, strict=True)]

    return decode_ids


def engine_decoder(engine: Any, beam_size: int, constrain_placeholders: bool) -> DecodeIds:
    """The serving engine (``service.runtime.engine.Engine``) as a backend: every row with its own
    budget, as the batcher submits them; the placeholder constraint when asked."""
    from service.runtime.types import DecodeRequest

    def decode_ids(
        ids: list[list[int]], budgets: list[int], copy_tokens: list[dict[int, int] | None]
    ) -> list[list[int]]:
        request_ids = [("evaluate", engine.steps, row) for row in range(len(ids))]
        rejected = engine.add(
            [
                DecodeRequest(
                    request_id=request_id,
                    src_ids=row_ids,
                    beam_size=beam_size,
                    max_new_tokens=budget,
                    copy_tokens=copies if constrain_placeholders else None,
                )
                for request_id, row_ids, budget, copies in zip(
                    request_ids, ids, budgets, copy_tokens, strict=True
                )
            ]
        )
        refused = {rejection.request_id for rejection in rejected}
        results: dict[object, list[int]] = {request_id: [] for request_id in refused}
        while len(results) < len(request_ids):
            for done in engine.step():
                results[done.request_id] = done.tokens
        return [results[request_id] for request_id in request_ids]

    return decode_ids


def translate(
    model: Transformer, tokenizer: Tokenizer, texts: list[str], beam_size: int = 1
) -> list[str]:
    """Translate with the PyTorch reference (used for validation during training)."""
    translations, _ = translate_with(
        torch_decoder(model, beam_size),
        tokenizer,
        texts,
        model_positions=model.config.max_positions,
    )
    return translations


def evaluate(
    model_dir: Path,
    corpus: Path,
    beam_size: int,
    limit: int | None,
    onnx_dir: Path | None,
    constrain_placeholders: bool = False,
    split: str = "test",
) -> dict:
    """Score ``model_dir`` (PyTorch) or its ONNX export (the serving engine) on a corpus split,
    in the model's own direction: an X→English model is scored on the swapped pairs."""
    languages = json.loads((model_dir / "tokenizer_config.json").read_text())
    source_lang = languages.get("source_lang", "en")
    if onnx_dir is None:
        tokenizer = Tokenizer.from_dir(model_dir)
        model = load_pretrained(model_dir)
        decode_ids = torch_decoder(model, beam_size)
        positions = model.config.max_positions
    else:
        from service.runtime.engine import Engine

        engine = Engine.from_dir(onnx_dir, provider="cpu")
        tokenizer = Tokenizer.from_dir(onnx_dir)
        # The service's placeholder constraint (service/runtime/search.py, CopyConstraint).
        decode_ids = engine_decoder(engine, beam_size, constrain_placeholders)
        positions = engine.model.info.max_positions

    pairs = read_direction(corpus / f"{split}.tsv", reverse=source_lang != "en")[:limit]
    sources, references = [source for source, _ in pairs], [target for _, target in pairs]
    started = time.perf_counter()
    hypotheses, refused = translate_with(
        decode_ids, tokenizer, sources, source_lang=source_lang, model_positions=positions
    )
    seconds = time.perf_counter() - started
    with_placeholders = [i for i, source in enumerate(sources) if placeholder_strings(source)]
    return {
        "model": str(model_dir),
        "backend": "pytorch" if onnx_dir is None else f"onnxruntime ({onnx_dir})",
        "placeholder_constraint": onnx_dir is not None and constrain_placeholders,
        "split": split,
        "direction": f"{source_lang}-{languages.get('target_lang')}",
        "test_pairs": len(pairs),
        "refused_texts": refused,
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
    parser.add_argument("--split", default="test", help="test, test-unseen, valid, …")
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
        args.split,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    for example in result["examples"]:
        print(
            f"SRC {example['source']}\nREF {example['reference']}\nOUT {example['translation']}\n"
        )
    print(json.dumps({key: value for key, value in result.items() if key != "examples"}, indent=2))


if __name__ == "__main__":
    main()
