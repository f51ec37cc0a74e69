"""Train the embedded default model on the gettext corpus, on CPU (or a GPU when there is one).

    python -m models.training.train --corpus build/corpus --out build/train [--max-minutes 90]
    python -m models.training.train --corpus build/corpus --out build/train --finalize models/default

Training resumes from ``OUT/checkpoint.pt`` when it exists, so a run cut short (a session's end)
continues where it stopped. Every ``--eval-every`` steps it decodes part of the validation split
greedily, scores chrF with sacrebleu, and keeps a weight snapshot; ``--finalize`` averages the
last snapshots, keeps whichever of (average, best single snapshot) scores higher on validation,
and writes it in our format with fp16 weights (quality per megabyte: the shipped file must stay
under 25 MB) plus the tokenizer files.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch
import torch.nn.functional as F
from tqdm import tqdm

from models.checkpoint import save_pretrained
from models.config import TransformerConfig
from models.training.corpus import read_tsv
from models.training.evaluate import translate
from models.transformer import Transformer
from service.placeholders import mask_pair
from service.tokenizer import Tokenizer

log = logging.getLogger("train")


@dataclass
class TrainingOptions:
    max_tokens: int = 2500  # target tokens per batch
    peak_lr: float = 7e-4
    warmup_steps: int = 600
    label_smoothing: float = 0.1
    weight_decay: float = 0.01
    max_len: int = 128  # pairs longer than this (tokens, either side) are skipped
    eval_every: int = 400
    eval_sentences: int = 400
    snapshots_kept: int = 5
    seed: int = 1


def default_model_config(
    vocab_size: int, pad_id: int, eos_id: int, unk_id: int
) -> TransformerConfig:
    """4 encoder + 3 decoder pre-norm layers of width 256: ~8.4M parameters, 17 MB in fp16.

    A deeper encoder than decoder: the decoder runs once per generated token, the encoder once
    per sentence, so decoder depth is what serving latency pays for.
    """
    return TransformerConfig(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        share_embeddings=True,
        tie_output=True,
        final_logits_bias=True,
        d_model=256,
        encoder_layers=4,
        decoder_layers=3,
        encoder_heads=4,
        decoder_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        max_positions=256,
        normalize_before=True,
        activation="relu",
        scale_embedding=True,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_id=pad_id,
        eos_id=eos_id,
        unk_id=unk_id,
        decoder_start_id=pad_id,
    )


# --- data --------------------------------------------------------------------------------


def encode_split(
    path: Path, tokenizer: Tokenizer, max_len: int
) -> list[tuple[list[int], list[int]]]:
    """(source ids, target ids) per pair, placeholders masked consistently on both sides."""
    pairs = read_tsv(path)
    masked = [mask_pair(pair.source, pair.target)[:2] for pair in pairs]
    source_ids = tokenizer.encode([source for source, _ in masked])
    target_ids = tokenizer.encode([target for _, target in masked])
    return [
        (src, tgt)
        for src, tgt in zip(source_ids, target_ids, strict=True)
        if len(src) <= max_len and len(tgt) <= max_len
    ]


def make_batches(
    examples: list[tuple[list[int], list[int]]], max_tokens: int, rng: random.Random
) -> list[list[int]]:
    """Indices grouped by length so that padding stays low, at most max_tokens target tokens
    (counted with padding) per batch; batch order shuffled."""
    order = sorted(
        range(len(examples)), key=lambda i: (len(examples[i][1]), len(examples[i][0]), rng.random())
    )
    batches, current, longest = [], [], 0
    for index in order:
        length = len(examples[index][1])
        if current and max(longest, length) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(
    examples: list[tuple[list[int], list[int]]], pad_id: int, start_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> src_ids, src_mask (B, S); decoder inputs and labels (B, T) (labels pad = -100)."""
    src_len = max(len(src) for src, _ in examples)
    tgt_len = max(len(tgt) for _, tgt in examples)
    batch = len(examples)
    src_ids = torch.full((batch, src_len), pad_id)
    tgt_in = torch.full((batch, tgt_len), pad_id)
    labels = torch.full((batch, tgt_len), -100)
    for row, (src, tgt) in enumerate(examples):
        src_ids[row, : len(src)] = torch.tensor(src)
        tgt_in[row, : len(tgt)] = torch.tensor([start_id, *tgt[:-1]])  # shifted right
        labels[row, : len(tgt)] = torch.tensor(tgt)
    return src_ids, (src_ids != pad_id).long(), tgt_in, labels


# --- evaluation --------------------------------------------------------------------------


def validation_chrf(
    model: Transformer, tokenizer: Tokenizer, sources: list[str], references: list[str]
) -> float:
    hypotheses = translate(model, tokenizer, sources)
    return sacrebleu.corpus_chrf(hypotheses, [references]).score


# --- training loop -----------------------------------------------------------------------


def inverse_sqrt_lr(step: int, options: TrainingOptions) -> float:
    step = max(step, 1)
    return options.peak_lr * min(
        step / options.warmup_steps, math.sqrt(options.warmup_steps / step)
    )


def train(corpus: Path, out: Path, max_minutes: float, options: TrainingOptions) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_dir(corpus / "tokenizer")
    vocab_size = len(json.loads((corpus / "tokenizer" / "vocab.json").read_text()))
    config = default_model_config(vocab_size, tokenizer.pad_id, tokenizer.eos_id, tokenizer.unk_id)
    torch.manual_seed(options.seed)
    model = Transformer(config)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=options.peak_lr,
        betas=(0.9, 0.98),
        eps=1e-9,
        weight_decay=options.weight_decay,
    )
    state = {"step": 0, "epoch": 0, "history": [], "snapshots": []}
    checkpoint_path = out / "checkpoint.pt"
    if checkpoint_path.exists():
        saved = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
        log.info("resumed at step %d (epoch %d)", state["step"], state["epoch"])
    config.save(out / "model_config.json")

    train_examples = encode_split(corpus / "train.tsv", tokenizer, options.max_len)
    valid_pairs = read_tsv(corpus / "valid.tsv")[: options.eval_sentences]
    valid_sources = [pair.source for pair in valid_pairs]
    valid_references = [pair.target for pair in valid_pairs]
    log.info(
        "model: %.1fM parameters; %d training pairs",
        sum(p.numel() for p in model.parameters()) / 1e6,
        len(train_examples),
    )

    deadline = time.monotonic() + max_minutes * 60
    while time.monotonic() < deadline:
        rng = random.Random(options.seed + state["epoch"])
        batches = make_batches(train_examples, options.max_tokens, rng)
        first_batch = state.get("batch_in_epoch", 0)
        progress = tqdm(
            batches[first_batch:],
            desc=f"epoch {state['epoch']}",
            mininterval=30,
            initial=first_batch,
            total=len(batches),
        )
        for batch_number, indices in enumerate(progress, start=first_batch):
            model.train()
            src_ids, src_mask, tgt_in, labels = collate(
                [train_examples[i] for i in indices], config.pad_id, config.decoder_start_id
            )
            logits = model(src_ids, src_mask, tgt_in)
            loss = F.cross_entropy(
                logits.view(-1, logits.shape[-1]), labels.view(-1),
                ignore_index=-100, label_smoothing=options.label_smoothing,
            )  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            state["step"] += 1
            for group in optimizer.param_groups:
                group["lr"] = inverse_sqrt_lr(state["step"], options)
            optimizer.step()
            progress.set_postfix(loss=f"{loss.item():.3f}", step=state["step"])
            state["batch_in_epoch"] = batch_number + 1

            if state["step"] % options.eval_every == 0 or time.monotonic() >= deadline:
                chrf = validation_chrf(model, tokenizer, valid_sources, valid_references)
                snapshot = out / f"snapshot_{state['step']}.pt"
                torch.save(model.state_dict(), snapshot)
                state["snapshots"] = [*state["snapshots"], str(snapshot)]
                for old in state["snapshots"][: -options.snapshots_kept]:
                    Path(old).unlink(missing_ok=True)
                state["snapshots"] = state["snapshots"][-options.snapshots_kept :]
                state["history"].append(
                    {
                        "step": state["step"],
                        "epoch": state["epoch"],
                        "loss": loss.item(),
                        "valid_chrf": chrf,
                        "snapshot": str(snapshot),
                    }
                )
                log.info(
                    "step %d epoch %d loss %.3f valid chrF %.2f",
                    state["step"],
                    state["epoch"],
                    loss.item(),
                    chrf,
                )
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "state": state,
                    },
                    checkpoint_path,
                )
                (out / "history.json").write_text(json.dumps(state["history"], indent=2))
            if time.monotonic() >= deadline:
                break
        else:
            state["epoch"] += 1
            state["batch_in_epoch"] = 0
    log.info("time budget reached at step %d", state["step"])


def finalize(corpus: Path, out: Path, destination: Path) -> None:
    """Average the kept snapshots, keep the better of average and best single, ship in fp16."""
    tokenizer = Tokenizer.from_dir(corpus / "tokenizer")
    config = TransformerConfig.load(out / "model_config.json")
    history = json.loads((out / "history.json").read_text())
    valid_pairs = read_tsv(corpus / "valid.tsv")[:1000]
    sources, references = [p.source for p in valid_pairs], [p.target for p in valid_pairs]
    existing = [entry for entry in history if Path(entry["snapshot"]).exists()]
    candidates: dict[str, dict[str, torch.Tensor]] = {}
    best_single = max(existing, key=lambda entry: entry["valid_chrf"])
    candidates[f"best snapshot (step {best_single['step']})"] = torch.load(
        best_single["snapshot"], weights_only=True
    )
    recent = [torch.load(entry["snapshot"], weights_only=True) for entry in existing[-4:]]
    if len(recent) > 1:
        candidates[f"average of last {len(recent)} snapshots"] = {
            name: sum(snapshot[name] for snapshot in recent) / len(recent) for name in recent[0]
        }
    model = Transformer(config)
    scores = {}
    for name, weights in candidates.items():
        model.load_state_dict(weights)
        scores[name] = validation_chrf(model, tokenizer, sources, references)
        log.info("%s: valid chrF %.2f", name, scores[name])
    chosen = max(scores, key=scores.get)
    model.load_state_dict(candidates[chosen])
    model.half()  # fp16 storage; loading casts back to fp32
    save_pretrained(model, destination, tokenizer_dir=corpus / "tokenizer")
    summary = {
        "chosen": chosen,
        "valid_chrf_1000": scores,
        "steps": history[-1]["step"],
        "epochs": history[-1]["epoch"],
    }
    (out / "finalize.json").write_text(json.dumps(summary, indent=2))
    log.info("wrote %s (%s)", destination, chosen)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus"))
    parser.add_argument("--out", type=Path, default=Path("build/train"))
    parser.add_argument("--max-minutes", type=float, default=90.0)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads; 0 keeps torch's default"
    )
    parser.add_argument(
        "--finalize", type=Path, help="write the final model to this directory and stop"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s",
        handlers=[logging.StreamHandler(), logging.FileHandler(args.out / "train.log")],
    )  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.finalize:
        finalize(args.corpus, args.out, args.finalize)
    else:
        train(args.corpus, args.out, args.max_minutes, TrainingOptions())


if __name__ == "__main__":
    main()
