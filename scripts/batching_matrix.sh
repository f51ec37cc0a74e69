#!/usr/bin/env bash
# Continuous vs static batching at 50 %, 85 % and 95 % of measured capacity, one run each.
#
#   bash scripts/batching_matrix.sh [MODEL_DIR] [DURATION_S]
#
# Capacity: closed loop, 32 clients, continuous batching, the mixed workload (80 % single UI
# strings, 20 % help paragraphs of several sentences). Then `python -m loadtest compare` (the
# same seeded open-loop Poisson schedule against each policy) at each fraction. Results in
# loadtest/results/ (capacity-*.json, compare-<pct>.json/.png); BENCHMARKS.md has the table.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-build/onnx/default}
DURATION=${2:-40}
PY=${PY:-.venv/bin/python}
MIX=ui=0.8,help=0.2
for policy in continuous static; do
  "$PY" -m loadtest closed --spawn-server "$MODEL" --server-env MT_BATCHING=$policy \
    --concurrency 32 --duration 30 --mix $MIX --name capacity-$policy --no-plot
done
CAPACITY=$("$PY" -c "import json; print(json.load(open('loadtest/results/capacity-continuous.json'))['summary']['throughput_rps'])")
echo "capacity (continuous, closed loop, 32 clients): $CAPACITY req/s"
for pct in 50 85 95; do
  RATE=$("$PY" -c "print(round($CAPACITY * $pct / 100, 2))")
  "$PY" -m loadtest compare --spawn-server "$MODEL" --rate "$RATE" --duration "$DURATION" \
    --mix $MIX --name compare-$pct
done
