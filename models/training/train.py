"""Train a default model on the gettext corpus, on a GPU when there is one, else the CPU.

    python -m models.training.train --corpus build/corpus --out build/train/en-de \
        --direction en-de --arch 6x2-256 [--max-minutes 90]
    python -m models.training.train --corpus build/corpus --out build/train/en-de \
        --direction en-de --finalize models/default

``--direction de-en`` trains the reverse model on the same corpus and joint tokenizer (the
corpus is English→X; its pairs are swapped). ``--arch`` picks one of :data:`ARCHITECTURES`, the
candidates compared in the model cards. On CUDA the forward and backward passes run in
bfloat16 autocast (weights and optimizer state stay fp32); validation decodes in fp32, outside
autocast, so the score does not depend on where training ran.

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

from models.checkpoint import load_pretrained, save_pretrained
from models.config import TransformerConfig
from models.training.corpus import read_direction
from models.training.evaluate import translate
from models.transformer import Transformer
from service.text.placeholders import mask_pair
from service.text.tokenizer import Tokenizer

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

    @classmethod
    def for_device(cls, device: torch.device) -> TrainingOptions:
        """CPU: the v1 recipe. CUDA: 4x larger batches (a GPU step costs about the same for
        any batch this size) and a correspondingly higher peak learning rate."""
        if device.type == "cuda":
            return cls(max_tokens=10000, peak_lr=1e-3, warmup_steps=1000, eval_every=500)
        return cls()


@dataclass(frozen=True)
class Architecture:
    """Shape of a candidate model. Encoder depth is paid once per sentence, decoder depth and
    width once per generated token (plus the vocab-wide output projection)."""

    d_model: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    ffn_dim: int


ARCHITECTURES: dict[str, Architecture] = {
    "4x3-256": Architecture(256, 4, 3, 4, 1024),  # v1: 8.4M parameters, 17 MB in fp16
    "6x2-256": Architecture(256, 6, 2, 4, 1024),  # deeper encoder, one decoder layer less
    "6x2-288": Architecture(288, 6, 2, 4, 1152),  # wider: 11.0M parameters, 22 MB in fp16
}
"""Candidates for the default models. All stay under 25 MB of fp16 weights (the embedded
default's limit), so width stops at 288: d_model 320 with six encoder layers is 26.5 MB."""
DEFAULT_ARCHITECTURE = "4x3-256"


def model_config(
    arch: Architecture, vocab_size: int, pad_id: int, eos_id: int, unk_id: int
) -> TransformerConfig:
    """Pre-norm encoder-decoder with shared, tied embeddings (one joint vocabulary)."""
    return TransformerConfig(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        share_embeddings=True,
        tie_output=True,
        final_logits_bias=True,
        d_model=arch.d_model,
        encoder_layers=arch.encoder_layers,
        decoder_layers=arch.decoder_layers,
        encoder_heads=arch.heads,
        decoder_heads=arch.heads,
        encoder_ffn_dim=arch.ffn_dim,
        decoder_ffn_dim=arch.ffn_dim,
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
    path: Path, tokenizer: Tokenizer, max_len: int, reverse: bool = False
) -> list[tuple[list[int], list[int]]]:
    """(source ids, target ids) per pair, placeholders masked consistently on both sides."""
    masked = [mask_pair(source, target)[:2] for source, target in read_direction(path, reverse)]
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
    """Greedy chrF through the service's text pipeline, in fp32 (outside autocast) on the
    device the model trains on."""
    hypotheses = translate(model, tokenizer, sources)
    return sacrebleu.corpus_chrf(hypotheses, [references]).score


# --- training loop -----------------------------------------------------------------------


def inverse_sqrt_lr(step: int, options: TrainingOptions) -> float:
    step = max(step, 1)
    return options.peak_lr * min(
        step / options.warmup_steps, math.sqrt(options.warmup_steps / step)
    )


def train(
    corpus: Path,
    out: Path,
    max_minutes: float,
    options: TrainingOptions,
    arch: str = DEFAULT_ARCHITECTURE,
    reverse: bool = False,
    device: torch.device | None = None,
    init_from: Path | None = None,
) -> None:
    """Train until ``max_minutes`` have passed, resuming from ``OUT/checkpoint.pt`` if there is
    one. ``init_from`` (a finalised model directory of the same architecture, and its
    ``finalize.json`` beside the run that made it) starts from those weights with a fresh
    optimizer, the learning-rate schedule continuing at that run's step: how a run continues
    on a machine where only the shipped fp16 weights came back, not the optimizer state."""
    out.mkdir(parents=True, exist_ok=True)
    device = device or torch.device("cpu")
    tokenizer = Tokenizer.from_dir(corpus / "tokenizer")
    vocab_size = len(json.loads((corpus / "tokenizer" / "vocab.json").read_text()))
    config = model_config(
        ARCHITECTURES[arch], vocab_size, tokenizer.pad_id, tokenizer.eos_id, tokenizer.unk_id
    )
    torch.manual_seed(options.seed)
    model = Transformer(config).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=options.peak_lr,
        betas=(0.9, 0.98),
        eps=1e-9,
        weight_decay=options.weight_decay,
        fused=device.type == "cuda",
    )
    # bf16 needs no loss scaling; on the CPU autocast stays off (fp32 as in v1).
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda")
    state = {"step": 0, "epoch": 0, "history": [], "snapshots": []}
    checkpoint_path = out / "checkpoint.pt"
    if checkpoint_path.exists():
        saved = torch.load(checkpoint_path, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
        log.info("resumed at step %d (epoch %d)", state["step"], state["epoch"])
    elif init_from is not None:
        model.load_state_dict(load_pretrained(init_from).state_dict())
        previous = json.loads((init_from / "training.json").read_text())
        state.update(step=previous["steps"], epoch=previous["epochs"] + 1)
        state["history"] = previous.get("history", [])
        log.info("initialised from %s at step %d", init_from, state["step"])
    config.save(out / "model_config.json")
    (out / "arch.json").write_text(json.dumps({"arch": arch, "reverse": reverse}) + "\n")

    train_examples = encode_split(corpus / "train.tsv", tokenizer, options.max_len, reverse)
    valid_pairs = read_direction(corpus / "valid.tsv", reverse)[: options.eval_sentences]
    valid_sources = [source for source, _ in valid_pairs]
    valid_references = [target for _, target in valid_pairs]
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
            src_ids, src_mask, tgt_in, labels = (
                tensor.to(device, non_blocking=True)
                for tensor in collate(
                    [train_examples[i] for i in indices], config.pad_id, config.decoder_start_id
                )
            )
            with autocast:
                logits = model(src_ids, src_mask, tgt_in)
            loss = F.cross_entropy(
                logits.float().view(-1, logits.shape[-1]), labels.view(-1),
                ignore_index=-100, label_smoothing=options.label_smoothing,
            )  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            state["step"] += 1
            for group in optimizer.param_groups:
                group["lr"] = inverse_sqrt_lr(state["step"], options)
            optimizer.step()
            if state["step"] % 50 == 0:  # .item() waits for the GPU: not every step
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


def finalize(corpus: Path, out: Path, destination: Path, reverse: bool = False) -> None:
    """Average the kept snapshots, keep the better of average and best single, ship in fp16."""
    tokenizer = Tokenizer.from_dir(corpus / "tokenizer")
    config = TransformerConfig.load(out / "model_config.json")
    history = json.loads((out / "history.json").read_text())
    valid_pairs = read_direction(corpus / "valid.tsv", reverse)[:1000]
    sources, references = [s for s, _ in valid_pairs], [t for _, t in valid_pairs]
    existing = [entry for entry in history if Path(entry["snapshot"]).exists()]
    candidates: dict[str, dict[str, torch.Tensor]] = {}
    best_single = max(existing, key=lambda entry: entry["valid_chrf"])
    candidates[f"best snapshot (step {best_single['step']})"] = torch.load(
        best_single["snapshot"], map_location="cpu", weights_only=True
    )
    recent = [
        torch.load(entry["snapshot"], map_location="cpu", weights_only=True)
        for entry in existing[-4:]
    ]
    if len(recent) > 1:
        candidates[f"average of last {len(recent)} snapshots"] = {
            name: sum(snapshot[name] for snapshot in recent) / len(recent) for name in recent[0]
        }
    model = Transformer(config).to("cuda" if torch.cuda.is_available() else "cpu")
    scores = {}
    for name, weights in candidates.items():
        model.load_state_dict(weights)
        scores[name] = validation_chrf(model, tokenizer, sources, references)
        log.info("%s: valid chrF %.2f", name, scores[name])
    chosen = max(scores, key=scores.get)
    model.load_state_dict(candidates[chosen])
    model.cpu().half()  # fp16 storage; loading casts back to fp32
    save_pretrained(model, destination, tokenizer_dir=corpus / "tokenizer")
    if reverse:  # the joint tokenizer was written for English→X: declare the swapped pair
        tokenizer_config_path = destination / "tokenizer_config.json"
        tokenizer_config = json.loads(tokenizer_config_path.read_text())
        tokenizer_config["source_lang"], tokenizer_config["target_lang"] = (
            tokenizer_config["target_lang"],
            tokenizer_config["source_lang"],
        )
        tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    summary = {
        "chosen": chosen,
        "valid_chrf_1000": scores,
        "steps": history[-1]["step"],
        "epochs": history[-1]["epoch"],
    }
    (out / "finalize.json").write_text(json.dumps(summary, indent=2))
    # Travels with the weights: what a continued run (--init-from) and the model card need.
    training_record = {
        **summary,
        "history": history,
        "arch": json.loads((out / "arch.json").read_text()),
    }
    (destination / "training.json").write_text(json.dumps(training_record, indent=2) + "\n")
    log.info("wrote %s (%s)", destination, chosen)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus"))
    parser.add_argument("--out", type=Path, default=Path("build/train"))
    parser.add_argument("--max-minutes", type=float, default=90.0)
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default=DEFAULT_ARCHITECTURE)
    parser.add_argument(
        "--direction", default="en-de",
        help="SRC-TGT; the corpus is English→X, so X-en trains on swapped pairs",
    )  # fmt: skip
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda")
    parser.add_argument("--eval-every", type=int, default=0, help="steps; 0: the device's default")
    parser.add_argument(
        "--init-from", type=Path,
        help="start from this finalised model directory's weights (fresh optimizer)",
    )  # fmt: skip
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
    reverse = args.direction.split("-")[0] != "en"
    if args.finalize:
        finalize(args.corpus, args.out, args.finalize, reverse)
        return
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    options = TrainingOptions.for_device(device)
    if args.eval_every:
        options.eval_every = args.eval_every
    train(
        args.corpus, args.out, args.max_minutes, options, args.arch, reverse, device, args.init_from
    )


if __name__ == "__main__":
    main()
