"""Choose a default model's architecture from measurements: quality and decode speed.

    python -m models.training.choose --speed bench/results/arch_speed.json \\
        --trained build/train/en-de-4x3-256 build/train/en-de-6x2-256 ... [--tolerance 0.5]

Quality is each candidate's validation chrF after training and finalising
(``finalize.json``, 1,000 validation pairs, greedy); speed is its mean tokens/s relative to v1
on this service's engine on 2 CPU cores (``bench/arch_speed.py``). The rule: **the fastest
candidate whose chrF is within ``tolerance`` of the best**. A user feels a 0.5 chrF difference
far less than a 1.5x latency difference, and a serving CPU pays for every decoder layer of every
token; a bigger model has to earn its cost in quality. Prints the choice as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_TOLERANCE = 0.5


def choose_architecture(
    valid_chrf: dict[str, float],
    speed_ratio: dict[str, float],
    tolerance: float = DEFAULT_TOLERANCE,
) -> str:
    """The fastest candidate whose chrF is within ``tolerance`` of the best; ties in speed go
    to the better chrF. Candidates without a speed measurement cannot be chosen."""
    measured = [name for name in valid_chrf if name in speed_ratio]
    if not measured:
        raise ValueError("no candidate has both a chrF and a speed measurement")
    best_chrf = max(valid_chrf[name] for name in measured)
    good_enough = [name for name in measured if valid_chrf[name] >= best_chrf - tolerance]
    return max(good_enough, key=lambda name: (speed_ratio[name], valid_chrf[name]))


def trained_chrf(run_dir: Path) -> float:
    """The shipped variant's validation chrF of one training run (``finalize.json``)."""
    summary = json.loads((run_dir / "finalize.json").read_text())
    return summary["valid_chrf_1000"][summary["chosen"]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", type=Path, required=True, help="bench/arch_speed.py's JSON")
    parser.add_argument("--trained", type=Path, nargs="+", required=True, help="run dirs")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    args = parser.parse_args(argv)
    speeds = json.loads(args.speed.read_text())["tokens_per_second"]
    arch_of = {
        run_dir: json.loads((run_dir / "arch.json").read_text())["arch"] for run_dir in args.trained
    }
    chrf = {arch_of[run_dir]: trained_chrf(run_dir) for run_dir in args.trained}
    speed_ratio = {name: row["mean_ratio_to_v1"] for name, row in speeds.items()}
    chosen = choose_architecture(chrf, speed_ratio, args.tolerance)
    run_dir = next(path for path, arch in arch_of.items() if arch == chosen)
    print(
        json.dumps(
            {"chosen": chosen, "run": str(run_dir), "valid_chrf": chrf, "speed_ratio": speed_ratio}
        )
    )


if __name__ == "__main__":
    main()
