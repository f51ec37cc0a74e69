"""How fast a candidate shape trains on this machine's CPUs, and what a v2-sized run would take.

``python bench/train_speed.py --arch 7x2-288 --arch 6x2-288`` times full training steps
(forward, label-smoothed loss, backward, clipping, AdamW) of each shape on batches of the CPU
recipe's 2,500 target tokens with padding, at several sentence lengths, with as many threads
as usable cores. bf16 autocast is used where the CPU has AMX or AVX512-BF16
(``--precision auto``), fp32 elsewhere. Then it projects the time to the target tokens v2
trained on (its steps, from training.json, times the GPU recipe's 10,000 tokens a batch),
printing JSON with the CPU flags and the load average around the run.

The batches are random token ids: the step's cost depends on the shapes, not the values.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from models.training.train import TrainingOptions, model_config
from models.training.train_v3 import CANDIDATES
from models.transformer import Transformer

VOCAB = 8000
LENGTHS = (8, 16, 32, 64)
"""Target lengths (tokens) of the timed batches: UI strings to documentation sentences."""


def cpu_flags() -> list[str]:
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    present = set(text.split())
    return [flag for flag in wanted if flag in present]


def step_seconds(arch_name: str, length: int, max_tokens: int, bf16: bool, steps: int) -> float:
    """Median seconds of one training step on a (max_tokens // length, length) batch."""
    config = model_config(CANDIDATES[arch_name], VOCAB, pad_id=0, eos_id=2, unk_id=1)
    torch.manual_seed(0)
    model = Transformer(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    rows = max_tokens // length
    src_ids = torch.randint(3, VOCAB, (rows, length))  # source about as long as the target
    src_mask = torch.ones_like(src_ids)
    tgt_in = torch.randint(3, VOCAB, (rows, length))
    labels = torch.randint(3, VOCAB, (rows, length))
    timings = []
    for step in range(steps + 1):
        started = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            logits = model(src_ids, src_mask, tgt_in)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1), label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step:  # the first step pays for allocation
            timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", choices=sorted(CANDIDATES))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per cell")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--v2-training", type=Path, default=Path("models/default/training.json"))
    args = parser.parse_args()
    flags = cpu_flags()
    bf16 = args.precision == "bf16" or (
        args.precision == "auto" and bool({"amx_bf16", "avx512_bf16"} & set(flags))
    )
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    max_tokens = TrainingOptions().max_tokens
    v2_steps = json.loads(args.v2_training.read_text())["steps"]
    v2_tokens = v2_steps * TrainingOptions.for_device(torch.device("cuda")).max_tokens
    result: dict[str, object] = {
        "cpu": platform.processor() or platform.machine(),
        "flags": flags,
        "threads": threads,
        "precision": "bf16" if bf16 else "fp32",
        "max_target_tokens_per_batch": max_tokens,
        "v2_steps": v2_steps,
        "v2_target_tokens": v2_tokens,
        "load_average_before": os.getloadavg(),
        "shapes": {},
    }
    for arch_name in args.arch or ["7x2-288"]:
        cells = {
            length: step_seconds(arch_name, length, max_tokens, bf16, args.steps)
            for length in LENGTHS
        }
        mean_step = statistics.mean(cells.values())
        result["shapes"][arch_name] = {  # type: ignore[index]
            "step_seconds_by_target_length": cells,
            "target_tokens_per_second": max_tokens / mean_step,
            "projected_hours_for_v2_tokens": v2_tokens * mean_step / max_tokens / 3600,
        }
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
