#!/usr/bin/env bash
# Continuous against static batching on the machine shapes given as arguments, with nothing else
# running: capacity (closed loop, continuous), then `compare` at 50/85/95 % of it, two runs
# each. JSON per cell under $RESULTS (loadtest/results/shapes/); summarise with
#   .venv/bin/python -m loadtest.shapes_report loadtest/results/shapes
# Usage: loadtest/machine_shapes.sh "1core:0:1" "2shared:0-1:0-1"   (name:server cpus:client cpus)
# Knobs (environment): PY, MODEL (an export dir), DURATION (s per cell), LOADS ("50 85 95"),
# RUNS ("1 2"), CONCURRENCY (closed-loop clients for capacity), CAPACITY_S, MIX, RESULTS,
# CAPACITY (req/s: skip the closed loop and load relative to this figure, e.g. the mean of
# several closed-loop runs; one 20 s closed loop on shared cores has come out 20 % low),
# INTERLEAVE (segments a cell's schedule is cut into, each run by both policies in turn, so
# a VM's drift falls on both alike; 0: one policy after the other; default 4, with CONTROL 6 so
# each of the three arms goes first twice). Each service is warmed up
# for 5 s first (`compare --warmup`). CONTROL=1 adds a second static batcher to every cell
# (`compare --control`): the A/A, what two identical policies give in the same run.
# The spawned servers inherit the environment (MT_PROVIDER=cuda serves on the GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:-build/onnx/default}
DURATION=${DURATION:-30}
LOADS=${LOADS:-50 85 95}
RUNS=${RUNS:-1 2}
CONCURRENCY=${CONCURRENCY:-32}
CAPACITY_S=${CAPACITY_S:-20}
MIX=${MIX:-ui=0.8,help=0.2}
INTERLEAVE=${INTERLEAVE:-$([ "${CONTROL:-0}" = 1 ] && echo 6 || echo 4)}
CONTROL_FLAG=()
if [ "${CONTROL:-0}" = 1 ]; then CONTROL_FLAG=(--control); fi
RESULTS=${RESULTS:-loadtest/results/shapes}
mkdir -p "$RESULTS"
for shape in "$@"; do
  IFS=: read -r name server client <<<"$shape"
  if [ -n "${CAPACITY:-}" ]; then
    capacity=$CAPACITY
  else
    $PY -m loadtest closed --spawn-server "$MODEL" --server-cpus "$server" --client-cpus "$client" \
      --concurrency "$CONCURRENCY" --duration "$CAPACITY_S" --mix "$MIX" --no-plot \
      --results-dir "$RESULTS" --name "$name-capacity" > "$RESULTS/$name-capacity.log" 2>&1
    capacity=$($PY -c "import json; d=json.load(open('$RESULTS/$name-capacity.json')); print(d['summary']['throughput_rps'])")
  fi
  echo "$name: capacity $capacity req/s"
  for load in $LOADS; do
    rate=$($PY -c "print(round($capacity * $load / 100, 2))")
    for run in $RUNS; do
      $PY -m loadtest compare --spawn-server "$MODEL" --server-cpus "$server" --client-cpus "$client" \
        --rate "$rate" --duration "$DURATION" --mix "$MIX" --seed "$run" --no-plot \
        --interleave "$INTERLEAVE" "${CONTROL_FLAG[@]}" \
        --results-dir "$RESULTS" --name "$name-load$load-run$run" > "$RESULTS/$name-load$load-run$run.log" 2>&1
      echo "$name load $load % ($rate req/s) run $run done"
    done
  done
done
