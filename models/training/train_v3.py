"""Train a v3 default model from carried token arrays, across several short GPU runs.

    python -m models.training.train_v3 --arrays build/arrays-v3 --out OUT/en-de \\
        --direction en-de --arch 6x2-288 [--resume PREVIOUS/en-de] [--max-minutes 9]

A GPU session lasts minutes, so one run may not reach convergence. The run therefore:

* reads the pairs from ``--arrays`` (:mod:`models.training.arrays`), nothing else;
* writes a checkpoint every ``--checkpoint-seconds`` (60) and when it stops: weights,
  optimizer state, RNG states and the data position (epoch, batch within the epoch), as
  ``checkpoint.json`` plus ``checkpoint.part-NNN`` files of at most ``--part-mb`` (a file
  that comes back from the GPU machine is at most 16 MiB);
* resumes from ``--resume DIR`` (the folder an earlier run wrote, sent back with the next
  run): the same step count, optimizer state and data position as if it had never stopped.
  Where only the best weights came back (the full checkpoint, with its AdamW moments, is too
  large to leave the GPU machine), it resumes from those: their step, schedule and data
  position, fresh moments, and the learning rate ramped up again over ``REWARM_STEPS``;
* validates every ``--eval-every`` steps: greedy chrF on the UI split (``valid.tsv``), the
  prose split (``valid-prose.tsv``) and the everyday sentences (``valid-general.tsv``), logged
  to ``history.json``; the best weights by their
  mean are kept (``best.part-NNN``, fp16);
* stops at convergence: when the mean has not gained ``--min-gain`` chrF over
  ``--patience-steps`` steps (``converged: true`` in ``checkpoint.json``), or at
  ``--max-minutes`` / ``--max-steps``.

``--direction de-en`` trains the reverse model on the same arrays (pairs swapped).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.config import TransformerConfig
from models.training.arrays import KINDS, MANIFEST, Examples, load_examples
from models.training.train import (
    ARCHITECTURES,
    Architecture,
    TrainingOptions,
    collate,
    inverse_sqrt_lr,
    model_config,
)
from models.transformer import Transformer

log = logging.getLogger("train_v3")

CHECKPOINT = "checkpoint"
BEST = "best"
REWARM_STEPS = 200
"""Steps over which a run resumed from weights alone ramps its learning rate back up: fresh
AdamW moments at the schedule's full rate would take steps as large as at the very start."""
DEFAULT_PART_MB = 15.0
CANDIDATES: dict[str, Architecture] = {
    **ARCHITECTURES,
    "7x2-288": Architecture(288, 7, 2, 4, 1152),
    "8x2-272": Architecture(272, 8, 2, 4, 1088),
    "6x2-304": Architecture(304, 6, 2, 4, 1216),
    "smoke": Architecture(d_model=32, encoder_layers=1, decoder_layers=1, heads=2, ffn_dim=64),
}
"""v2's candidates; v3's, which spend what v2's 22 MB leave of the 25 MB limit on a deeper
encoder (paid once a sentence) or a wider model (paid at every token); and a tiny shape for
the seconds-long dry run of the GPU script."""
Validator = Callable[[Transformer], dict[str, float]]


@dataclass
class RunOptions:
    """What a run may do, beside the recipe (:class:`TrainingOptions`)."""

    max_minutes: float = 9.0
    max_steps: int = 0  # 0: no limit
    checkpoint_seconds: float = 60.0
    patience_steps: int = 4000
    min_gain: float = 0.1
    part_mb: float = DEFAULT_PART_MB


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_score: float = -1.0
    best_step: int = 0
    converged: bool = False
    rewarm_from: int = -1  # the step a resume from weights alone restarted the moments at
    history: list[dict[str, float]] = field(default_factory=list)


def epoch_batches(
    examples: Examples, max_tokens: int, seed: int, epoch: int, reverse: bool
) -> list[np.ndarray]:
    """The batches of one epoch: pair indices grouped by target length (little padding), at
    most ``max_tokens`` target tokens with padding per batch, in an order fixed by
    ``(seed, epoch)``, so a resumed run sees the same batches."""
    rng = np.random.default_rng([seed, epoch])
    target_lengths = examples.src_lens if reverse else examples.tgt_lens
    source_lengths = examples.tgt_lens if reverse else examples.src_lens
    order = np.lexsort((rng.random(len(examples)), source_lengths, target_lengths))
    batches, start = [], 0
    while start < len(order):
        end, longest = start, 0
        while end < len(order):
            longest_if_added = max(longest, int(target_lengths[order[end]]))
            if end > start and longest_if_added * (end - start + 1) > max_tokens:
                break
            longest, end = longest_if_added, end + 1
        batches.append(order[start:end])
        start = end
    return [batches[i] for i in rng.permutation(len(batches))]


# --- checkpoints in parts ------------------------------------------------------------------


def fp16_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights in fp16 on the CPU, a tensor that several names share (the tied embeddings)
    converted once, so it is saved once: the best weights travel back at the shipped size."""
    converted: dict[int, torch.Tensor] = {}
    weights = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in converted:
            converted[tensor.data_ptr()] = tensor.detach().cpu().half()
        weights[name] = converted[tensor.data_ptr()]
    return weights


def write_in_parts(payload: object, out: Path, stem: str, part_mb: float, meta: dict) -> None:
    """``torch.save`` ``payload`` as ``<stem>.part-NNN`` files of at most ``part_mb`` and a
    ``<stem>.json`` naming them with their hash; the JSON is written last, so a run killed
    mid-write leaves the previous complete checkpoint readable."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    part_bytes = max(1, int(part_mb * 1e6))
    names = []
    for number, start in enumerate(range(0, len(data), part_bytes)):
        name = f"{stem}.part-{number:03d}"
        (out / f"{name}.tmp").write_bytes(data[start : start + part_bytes])
        (out / f"{name}.tmp").replace(out / name)
        names.append(name)
    for stale in out.glob(f"{stem}.part-*"):
        if stale.name not in names:
            stale.unlink()
    record = {
        **meta,
        "parts": names,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (out / f"{stem}.json.tmp").write_text(json.dumps(record, indent=2) + "\n")
    (out / f"{stem}.json.tmp").replace(out / f"{stem}.json")


def read_in_parts(folder: Path, stem: str) -> tuple[object, dict]:
    record = json.loads((folder / f"{stem}.json").read_text())
    data = b"".join((folder / name).read_bytes() for name in record["parts"])
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise ValueError(f"{folder / stem}: parts do not match their SHA-256")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False), record


# --- the trainer ---------------------------------------------------------------------------


class Trainer:
    """One direction's model, optimizer and data position; :meth:`run` trains until a limit
    or convergence, checkpointing as it goes."""

    def __init__(
        self,
        examples: Examples,
        config: TransformerConfig,
        options: TrainingOptions,
        out: Path,
        reverse: bool = False,
        device: torch.device | None = None,
        validator: Validator | None = None,
    ) -> None:
        self.examples, self.config, self.options = examples, config, options
        self.out, self.reverse = out, reverse
        self.device = device or torch.device("cpu")
        self.validator = validator
        torch.manual_seed(options.seed)
        self.model = Transformer(config).to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=options.peak_lr, betas=(0.9, 0.98), eps=1e-9,
            weight_decay=options.weight_decay, fused=self.device.type == "cuda",
        )  # fmt: skip
        self.progress = Progress()
        self._batches: list[np.ndarray] | None = None

    # state -------------------------------------------------------------------------------

    def state(self) -> dict[str, object]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "progress": asdict(self.progress),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
            "python_rng": random.getstate(),
        }

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = Progress(**state["progress"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        random.setstate(state["python_rng"])
        self._batches = None

    def save_checkpoint(self) -> None:
        meta = {
            "step": self.progress.step,
            "epoch": self.progress.epoch,
            "batch_in_epoch": self.progress.batch_in_epoch,
            "converged": self.progress.converged,
            "best_score": self.progress.best_score,
        }
        write_in_parts(self.state(), self.out, CHECKPOINT, self.run_options.part_mb, meta)
        (self.out / "history.json").write_text(json.dumps(self.progress.history, indent=2))

    def resume(self, folder: Path) -> None:
        """Continue from ``folder``: its full checkpoint where its parts are there, else the
        best weights that came back (:meth:`resume_from_weights`)."""
        if (folder / f"{CHECKPOINT}.json").exists():
            record = json.loads((folder / f"{CHECKPOINT}.json").read_text())
            if all((folder / name).exists() for name in record["parts"]):
                state, record = read_in_parts(folder, CHECKPOINT)
                self.load_state(state)  # type: ignore[arg-type]
                log.info("resumed from %s at step %d", folder, record["step"])
                return
        self.resume_from_weights(folder)

    def resume_from_weights(self, folder: Path) -> None:
        """The best weights of an earlier run, at the step, epoch and batch they were kept at,
        with the curve so far; the optimizer starts afresh (see :data:`REWARM_STEPS`)."""
        weights, record = read_in_parts(folder, BEST)
        self.model.load_state_dict({name: t.float() for name, t in weights.items()})  # type: ignore[attr-defined]
        history_file = folder / "history.json"
        history = json.loads(history_file.read_text()) if history_file.exists() else []
        self.progress = Progress(
            step=record["step"], epoch=record["epoch"], batch_in_epoch=record["batch_in_epoch"],
            best_score=record["score"], best_step=record["step"], rewarm_from=record["step"],
            history=[entry for entry in history if entry["step"] <= record["step"]],
        )  # fmt: skip
        torch.manual_seed(self.options.seed + record["step"])
        self._batches = None
        log.info("resumed from the best weights in %s at step %d", folder, record["step"])

    def learning_rate(self) -> float:
        rate = inverse_sqrt_lr(self.progress.step, self.options)
        if self.progress.rewarm_from >= 0:
            rate *= min(1.0, (self.progress.step - self.progress.rewarm_from) / REWARM_STEPS)
        return rate

    # training ----------------------------------------------------------------------------

    run_options = RunOptions()

    def _next_batch(self) -> np.ndarray:
        if self._batches is None:
            self._batches = epoch_batches(
                self.examples, self.options.max_tokens, self.options.seed,
                self.progress.epoch, self.reverse,
            )  # fmt: skip
        if self.progress.batch_in_epoch >= len(self._batches):
            self.progress.epoch += 1
            self.progress.batch_in_epoch = 0
            self._batches = None
            return self._next_batch()
        batch = self._batches[self.progress.batch_in_epoch]
        self.progress.batch_in_epoch += 1
        return batch

    def train_step(self) -> float:
        self.model.train()
        indices = self._next_batch()
        pairs = [self.examples.pair(int(i), self.reverse) for i in indices]
        src_ids, src_mask, tgt_in, labels = (
            tensor.to(self.device, non_blocking=True)
            for tensor in collate(pairs, self.config.pad_id, self.config.decoder_start_id)
        )
        autocast = torch.autocast(
            self.device.type, torch.bfloat16, enabled=self.device.type == "cuda"
        )
        with autocast:
            logits = self.model(src_ids, src_mask, tgt_in)
        loss = F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]), labels.view(-1),
            ignore_index=-100, label_smoothing=self.options.label_smoothing,
        )  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.progress.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        self.optimizer.step()
        return float(loss.detach())

    def validate(self, loss: float) -> None:
        """Score, log, keep the best weights, and decide convergence."""
        if self.validator is None:
            return
        scores = self.validator(self.model)
        score = sum(scores.values()) / len(scores)
        entry = {"step": self.progress.step, "epoch": self.progress.epoch, "loss": loss, **scores}
        self.progress.history.append(entry)
        log.info("step %d %s", self.progress.step, json.dumps(entry))
        if score >= self.progress.best_score + self.run_options.min_gain:
            self.progress.best_score, self.progress.best_step = score, self.progress.step
            position = {"batch_in_epoch": self.progress.batch_in_epoch, "score": score}
            weights = fp16_weights(self.model)
            write_in_parts(weights, self.out, BEST, self.run_options.part_mb, entry | position)
            (self.out / "history.json").write_text(json.dumps(self.progress.history, indent=2))
        elif self.progress.step - self.progress.best_step >= self.run_options.patience_steps:
            self.progress.converged = True

    def run(self, run_options: RunOptions) -> Progress:
        self.run_options = run_options
        self.out.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        deadline = started + run_options.max_minutes * 60
        last_checkpoint = started
        loss = float("nan")
        while not self.progress.converged:
            if run_options.max_steps and self.progress.step >= run_options.max_steps:
                break
            if time.monotonic() >= deadline:
                break
            loss = self.train_step()
            if self.progress.step % self.options.eval_every == 0:
                self.validate(loss)
            if time.monotonic() - last_checkpoint >= run_options.checkpoint_seconds:
                self.save_checkpoint()
                last_checkpoint = time.monotonic()
        self.save_checkpoint()
        log.info(
            "stopped at step %d (converged: %s, best %.2f at step %d)",
            self.progress.step, self.progress.converged,
            self.progress.best_score, self.progress.best_step,
        )  # fmt: skip
        return self.progress


# --- wiring ----------------------------------------------------------------------------------


def chrf_validator(
    arrays: Path, reverse: bool, sentences: int, tokenizer_dir: Path | None = None
) -> Validator:
    """Greedy chrF on ``valid.tsv`` ("ui"), ``valid-prose.tsv`` ("prose") and
    ``valid-general.tsv`` ("general") where present."""
    from models.training.corpus import read_direction
    from models.training.train import validation_chrf
    from service.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(tokenizer_dir or arrays / "tokenizer")
    splits = {}
    for name, file in (
        ("ui", "valid.tsv"), ("prose", "valid-prose.tsv"), ("general", "valid-general.tsv")
    ):  # fmt: skip
        if (arrays / file).exists():
            pairs = read_direction(arrays / file, reverse)[:sentences]
            if pairs:
                splits[name] = ([s for s, _ in pairs], [t for _, t in pairs])

    def validate(model: Transformer) -> dict[str, float]:
        return {
            f"chrf_{name}": round(validation_chrf(model, tokenizer, sources, references), 2)
            for name, (sources, references) in splits.items()
        }

    return validate


def build_trainer(
    arrays: Path, out: Path, arch: Architecture, options: TrainingOptions, reverse: bool,
    device: torch.device, kinds: tuple[str, ...] = KINDS, validate: bool = True,
) -> Trainer:  # fmt: skip
    manifest = json.loads((arrays / MANIFEST).read_text())
    examples = load_examples(arrays, kinds)
    vocab = json.loads((arrays / "tokenizer" / "vocab.json").read_text())
    config = model_config(
        arch, manifest["vocab_size"], vocab["<pad>"], vocab["</s>"], vocab["<unk>"]
    )
    out.mkdir(parents=True, exist_ok=True)
    config.save(out / "model_config.json")
    validator = chrf_validator(arrays, reverse, options.eval_sentences) if validate else None
    log.info(
        "%.1fM parameters; %d pairs", sum(p.numel() for p in Transformer(config).parameters()) / 1e6,
        len(examples),
    )  # fmt: skip
    return Trainer(examples, config, options, out, reverse, device, validator)


def finalize(run: Path, arrays: Path, destination: Path) -> None:
    """Ship a run's best weights (fp16, as they were kept) in our format with the tokenizer;
    the curve travels as ``training.json``."""
    from models.checkpoint import save_pretrained

    weights, record = read_in_parts(run, BEST)
    config = TransformerConfig.load(run / "model_config.json")
    model = Transformer(config)
    model.load_state_dict({name: tensor.float() for name, tensor in weights.items()})  # type: ignore[attr-defined]
    model.half()
    save_pretrained(model, destination, tokenizer_dir=arrays / "tokenizer")
    run_record = json.loads((run / "run.json").read_text())
    if run_record["direction"].split("-")[0] != "en":  # the joint tokenizer was written en→X
        tokenizer_config_path = destination / "tokenizer_config.json"
        tokenizer_config = json.loads(tokenizer_config_path.read_text())
        tokenizer_config["source_lang"], tokenizer_config["target_lang"] = (
            tokenizer_config["target_lang"],
            tokenizer_config["source_lang"],
        )
        tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    history = json.loads((run / "history.json").read_text())
    training = {**run_record, "best": {k: v for k, v in record.items() if k not in ("parts",)}}
    training["history"] = history
    (destination / "training.json").write_text(json.dumps(training, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arrays", type=Path, default=Path("build/arrays-v3"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--resume", type=Path, help="folder of an earlier run's checkpoint, or of its best weights"
    )
    parser.add_argument("--direction", default="en-de")
    parser.add_argument("--arch", choices=sorted(CANDIDATES), default="6x2-288")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kinds", default=",".join(KINDS), help="pair kinds to train on")
    parser.add_argument("--max-minutes", type=float, default=RunOptions.max_minutes)
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--checkpoint-seconds", type=float, default=RunOptions.checkpoint_seconds)
    parser.add_argument("--patience-steps", type=int, default=RunOptions.patience_steps)
    parser.add_argument("--min-gain", type=float, default=RunOptions.min_gain)
    parser.add_argument("--part-mb", type=float, default=DEFAULT_PART_MB)
    parser.add_argument("--eval-every", type=int, default=0, help="0: the device's default")
    parser.add_argument("--eval-sentences", type=int, default=0, help="0: the recipe's")
    parser.add_argument("--max-tokens", type=int, default=0, help="0: the device's default")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument(
        "--finalize", type=Path, help="write the run's best weights to this model directory"
    )
    args = parser.parse_args(argv)
    if args.finalize:
        finalize(args.out, args.arrays, args.finalize)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s",
        handlers=[logging.StreamHandler(), logging.FileHandler(args.out / "train.log")],
    )  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    options = TrainingOptions.for_device(device)
    options.eval_every = args.eval_every or options.eval_every
    options.eval_sentences = args.eval_sentences or options.eval_sentences
    options.max_tokens = args.max_tokens or options.max_tokens
    reverse = args.direction.split("-")[0] != "en"
    trainer = build_trainer(
        args.arrays, args.out, CANDIDATES[args.arch], options, reverse, device,
        tuple(args.kinds.split(",")),
    )  # fmt: skip
    (args.out / "run.json").write_text(
        json.dumps({"arch": args.arch, "direction": args.direction, "kinds": args.kinds}) + "\n"
    )
    if args.resume is not None and any(
        (args.resume / f"{stem}.json").exists() for stem in (CHECKPOINT, BEST)
    ):
        trainer.resume(args.resume)
    run_options = RunOptions(
        args.max_minutes, args.max_steps, args.checkpoint_seconds, args.patience_steps,
        args.min_gain, args.part_mb,
    )  # fmt: skip
    trainer.run(run_options)


if __name__ == "__main__":
    main()
