"""The fp32 and fp16 exports on ONNX Runtime's CUDA provider, against PyTorch and each other.

    python bench/gpu_parity.py --model models/default --fp32 build/onnx/default \\
        --fp16 build/onnx/default-fp16 --language en --output parity-default.json

Three measures per export, each refusing a silent CPU fallback:

1. **Logits**: ``export.verify.logits_errors`` on the CUDA provider: max |ORT - PyTorch| of the
   encoder's cross K/V, the decoder's logits, its new K/V and its search head, on a padded
   batch at past lengths 0, 1 and 3, against the fp32 PyTorch model on the CPU.
2. **Search**: ``export.verify.decode_agreement`` on CUDA: the share of random sources whose
   greedy and beam-4 decodes are token-identical to ``models.search``.
3. **Held-out strings**: every ``--language`` string of bench/heldout/ui_strings_en_de.json
   (interface strings of packages the models never saw) translated greedy and beam 4 by the
   engine on the CPU in fp32 (the reference), on CUDA in fp32 and on CUDA in fp16: the share of
   outputs identical to the reference and chrF against the reference's outputs.

Writes one JSON object to ``--output`` and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from export.verify import decode_agreement, logits_errors  # noqa: E402
from models.checkpoint import load_pretrained  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402
from service.text.tokenizer import Tokenizer  # noqa: E402

HELDOUT = Path(__file__).resolve().parent / "heldout" / "ui_strings_en_de.json"
MAX_NEW_TOKENS = 128
BATCH = 32  # strings per translate_ids call: the engine batches them as the service would


def heldout_strings(language: str) -> list[str]:
    data = json.loads(HELDOUT.read_text())
    return [
        text
        for project in data["strings"].values()
        for kind in project[language].values()
        for text in kind
    ]


def translate(engine: Engine, tokenizer: Tokenizer, texts: list[str], beam: int) -> list[str]:
    outputs: list[str] = []
    for start in range(0, len(texts), BATCH):
        sources = tokenizer.encode(texts[start : start + BATCH])
        ids = engine.translate_ids(sources, beam_size=beam, max_new_tokens=MAX_NEW_TOKENS)
        outputs += [tokenizer.decode(row) for row in ids]
    return outputs


def heldout_agreement(
    exports: dict[str, tuple[Path, str]], tokenizer: Tokenizer, texts: list[str]
) -> dict[str, Any]:
    import sacrebleu

    result: dict[str, Any] = {"strings": len(texts)}
    for beam in (1, 4):
        outputs: dict[str, list[str]] = {}
        for name, (directory, provider) in exports.items():
            engine = Engine.from_dir(directory, provider=provider)  # type: ignore[arg-type]
            if engine.provider != provider:
                raise RuntimeError(f"{name}: asked for {provider}, got {engine.provider}")
            started = time.perf_counter()
            outputs[name] = translate(engine, tokenizer, texts, beam)
            result.setdefault(name, {})[f"beam{beam}_seconds"] = round(
                time.perf_counter() - started, 2
            )
        reference = outputs["fp32-cpu"]
        for name, hypotheses in outputs.items():
            same = sum(a == b for a, b in zip(hypotheses, reference, strict=True))
            chrf = sacrebleu.corpus_chrf(hypotheses, [reference]).score
            result[name][f"beam{beam}_identical"] = round(same / len(texts), 4)
            result[name][f"beam{beam}_chrf_vs_fp32_cpu"] = round(chrf, 2)
        result[f"beam{beam}_examples"] = [
            {name: outputs[name][i] for name in ("fp32-cpu", *outputs)}
            for i, (a, b) in enumerate(zip(outputs["fp16-cuda"], reference, strict=True))
            if a != b
        ][:5]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path, help="PyTorch model dir")
    parser.add_argument("--fp32", required=True, type=Path, help="fp32 export dir")
    parser.add_argument("--fp16", required=True, type=Path, help="fp16 export dir")
    parser.add_argument("--language", required=True, choices=("en", "de"), help="source side")
    parser.add_argument("--limit", type=int, default=0, help="held-out strings at most (0: all)")
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args(argv)

    model = load_pretrained(args.model).eval()
    report: dict[str, Any] = {"model": str(args.model)}
    for name, directory in (("fp32", args.fp32), ("fp16", args.fp16)):
        errors = logits_errors(model, directory, past_lengths=(0, 1, 3), provider="cuda")
        report[f"{name}_cuda_logits_max_abs_error"] = {k: round(v, 6) for k, v in errors.items()}
        report[f"{name}_cuda_decodes_identical_to_pytorch"] = decode_agreement(
            model, directory, [12, 4, 8, 10, 6, 9, 7, 11], provider="cuda"
        )
    texts = heldout_strings(args.language)
    if args.limit:
        texts = texts[: args.limit]
    exports = {
        "fp32-cpu": (args.fp32, "cpu"),
        "fp32-cuda": (args.fp32, "cuda"),
        "fp16-cuda": (args.fp16, "cuda"),
    }
    report["heldout"] = heldout_agreement(exports, Tokenizer.from_dir(args.fp32), texts)
    args.output.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
