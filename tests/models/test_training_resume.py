"""Training from carried arrays: a run stopped and resumed from its checkpoint continues the
same schedule as one that never stopped (tiny model, CPU, a few steps)."""

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from models.training.arrays import KINDS, MANIFEST, load_examples, write_parts
from models.training.train import Architecture, TrainingOptions, inverse_sqrt_lr, model_config
from models.training.train_v3 import (
    REWARM_STEPS,
    RunOptions,
    Trainer,
    epoch_batches,
    fp16_weights,
    read_in_parts,
)

VOCAB = 40
PAD, EOS, UNK = VOCAB - 1, 0, 1
TINY = Architecture(d_model=16, encoder_layers=1, decoder_layers=1, heads=2, ffn_dim=32)


def _pairs(count: int, seed: int = 0) -> list[tuple[list[int], list[int], int]]:
    rng = random.Random(seed)
    pairs = []
    for index in range(count):
        english = [rng.randrange(2, PAD) for _ in range(rng.randint(1, 7))] + [EOS]
        german = [rng.randrange(2, PAD) for _ in range(rng.randint(1, 9))] + [EOS]
        pairs.append((english, german, index % len(KINDS)))
    return pairs


@pytest.fixture()
def arrays(tmp_path: Path) -> Path:
    folder = tmp_path / "arrays"
    parts = write_parts(_pairs(30), folder, part_bytes=200)
    (folder / MANIFEST).write_text(json.dumps({"vocab_size": VOCAB, "parts": parts}))
    return folder


def _trainer(arrays: Path, out: Path) -> Trainer:
    options = TrainingOptions(max_tokens=48, warmup_steps=3, eval_every=1000, seed=7)
    config = model_config(TINY, VOCAB, PAD, EOS, UNK)
    return Trainer(load_examples(arrays), config, options, out)


def _run(trainer: Trainer, steps: int) -> None:
    trainer.run(RunOptions(max_minutes=5, max_steps=steps, checkpoint_seconds=1e9, part_mb=0.01))


def test_arrays_round_trip_in_parts_no_larger_than_asked(arrays: Path) -> None:
    expected = _pairs(30)
    examples = load_examples(arrays)
    assert [examples.pair(i) for i in range(len(examples))] == [(e, g) for e, g, _ in expected]
    assert examples.pair(0, reverse=True) == (expected[0][1], expected[0][0])
    token_files = sorted(arrays.glob("*.tokens.npy"))
    assert len(token_files) > 1
    assert all(np.load(path).nbytes <= 200 for path in token_files)
    prose = [(e, g) for e, g, kind in expected if KINDS[kind] == "prose"]
    only_prose = load_examples(arrays, kinds=("prose",))
    assert 0 < len(only_prose) < len(expected)
    assert [only_prose.pair(i) for i in range(len(only_prose))] == prose


def test_resumed_run_continues_the_same_schedule(arrays: Path, tmp_path: Path) -> None:
    uninterrupted = _trainer(arrays, tmp_path / "whole")
    _run(uninterrupted, steps=9)

    first = _trainer(arrays, tmp_path / "first")
    _run(first, steps=4)
    checkpoint_parts = list((tmp_path / "first").glob("checkpoint.part-*"))
    assert len(checkpoint_parts) > 1  # split to the size asked for
    second = _trainer(arrays, tmp_path / "second")
    second.resume(tmp_path / "first")
    assert second.progress.step == 4
    _run(second, steps=9)

    batches_per_epoch = len(epoch_batches(load_examples(arrays), 48, 7, 0, False))
    assert batches_per_epoch < 9  # the schedule crosses an epoch boundary
    assert (second.progress.step, second.progress.epoch, second.progress.batch_in_epoch) == (
        uninterrupted.progress.step,
        uninterrupted.progress.epoch,
        uninterrupted.progress.batch_in_epoch,
    )
    for name, weight in uninterrupted.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], weight), name
    whole_state = uninterrupted.optimizer.state_dict()["state"]
    resumed_state = second.optimizer.state_dict()["state"]
    for key, moments in whole_state.items():
        assert torch.equal(resumed_state[key]["exp_avg_sq"], moments["exp_avg_sq"])
        assert resumed_state[key]["step"] == moments["step"]
    assert second.optimizer.param_groups[0]["lr"] == uninterrupted.optimizer.param_groups[0]["lr"]


def test_checkpoint_parts_are_checked_against_their_hash(arrays: Path, tmp_path: Path) -> None:
    trainer = _trainer(arrays, tmp_path / "run")
    _run(trainer, steps=1)
    part = sorted((tmp_path / "run").glob("checkpoint.part-*"))[0]
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(ValueError, match="SHA-256"):
        read_in_parts(tmp_path / "run", "checkpoint")


def test_training_stops_when_validation_stops_gaining(arrays: Path, tmp_path: Path) -> None:
    trainer = _trainer(arrays, tmp_path / "run")
    trainer.options.eval_every = 1
    scores = iter([10.0, 12.0, 12.05, 11.0, 12.0, 30.0])
    trainer.validator = lambda model: {"chrf_ui": next(scores), "chrf_prose": 0.0}
    progress = trainer.run(RunOptions(max_steps=6, patience_steps=3, min_gain=0.1, part_mb=1))
    assert progress.converged and progress.step == 5 and progress.best_step == 2
    saved = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    assert saved["converged"] is True and saved["step"] == 5
    assert json.loads((tmp_path / "run" / "best.json").read_text())["step"] == 2


def test_best_weights_keep_the_tied_embeddings_as_one_tensor(arrays: Path, tmp_path: Path) -> None:
    trainer = _trainer(arrays, tmp_path / "run")
    trainer.options.eval_every = 1
    trainer.validator = lambda model: {"chrf_ui": 1.0}
    trainer.run(RunOptions(max_steps=1, part_mb=1))
    weights, record = read_in_parts(tmp_path / "run", "best")
    assert weights["src_embed.weight"].dtype == torch.float16
    assert weights["src_embed.weight"].data_ptr() == weights["tgt_embed.weight"].data_ptr()
    name_by_name = io.BytesIO()
    torch.save({name: tensor.clone() for name, tensor in weights.items()}, name_by_name)
    assert record["bytes"] < len(name_by_name.getvalue())  # the shared tensor saved once
    assert fp16_weights(trainer.model).keys() == trainer.model.state_dict().keys()


def test_a_run_resumes_from_the_best_weights_when_only_they_came_back(
    arrays: Path, tmp_path: Path
) -> None:
    first = _trainer(arrays, tmp_path / "first")
    first.options.eval_every = 1
    scores = iter([*range(10, 16), 1.0, 1.0])  # the best at step 6, two later steps worse
    first.validator = lambda model: {"chrf_ui": float(next(scores))}
    first.run(RunOptions(max_steps=8, part_mb=0.01))
    returned = tmp_path / "returned"  # what leaves the GPU machine: no checkpoint parts
    returned.mkdir()
    for path in (tmp_path / "first").iterdir():
        if not path.name.startswith("checkpoint.part-"):
            (returned / path.name).write_bytes(path.read_bytes())

    second = _trainer(arrays, tmp_path / "second")
    second.resume(returned)
    at_best = _trainer(arrays, tmp_path / "at-best")  # the first run, stopped at its best
    at_best.options.eval_every = 1
    at_best.validator = lambda model: {"chrf_ui": 1.0}
    at_best.run(RunOptions(max_steps=6, part_mb=0.01))
    assert (second.progress.step, second.progress.epoch, second.progress.batch_in_epoch) == (
        at_best.progress.step, at_best.progress.epoch, at_best.progress.batch_in_epoch,
    )  # fmt: skip
    assert second.progress.best_score == first.progress.best_score
    assert [entry["step"] for entry in second.progress.history] == [1, 2, 3, 4, 5, 6]
    for name, tensor in at_best.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], tensor.half().float()), name
    assert not second.optimizer.state  # the moments start afresh
    assert np.array_equal(second._next_batch(), at_best._next_batch())  # the same data next

    _run(second, steps=8)
    schedule = inverse_sqrt_lr(8, second.options)
    assert second.optimizer.param_groups[0]["lr"] == pytest.approx(schedule * 2 / REWARM_STEPS)
