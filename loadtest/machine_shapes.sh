#!/usr/bin/env bash
# Continuous against static batching on the machine shapes of issue #28, with nothing else
# running: capacity (closed loop, 32 clients, continuous), then `compare` at 50/85/95 % of it,
# two runs each. JSON per cell under loadtest/results/shapes/; summarise with
#   .venv/bin/python -m loadtest.shapes_report loadtest/results/shapes
# Usage: loadtest/machine_shapes.sh "1core:0:1" "2shared:0-1:0-1"   (name:server cpus:client cpus)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MODEL=${MODEL:-build/onnx/default}
DURATION=${DURATION:-30}
MIX=${MIX:-ui=0.8,help=0.2}
OUT=loadtest/results/shapes
mkdir -p "$OUT"
for shape in "$@"; do
  IFS=: read -r name server client <<<"$shape"
  $PY -m loadtest closed --spawn-server "$MODEL" --server-cpus "$server" --client-cpus "$client" \
    --concurrency 32 --duration 20 --mix "$MIX" --no-plot --results-dir "$OUT" \
    --name "$name-capacity" > "$OUT/$name-capacity.log" 2>&1
  capacity=$($PY -c "import json,sys; d=json.load(open('$OUT/$name-capacity.json')); print(d['summary']['throughput_rps'])")
  echo "$name: capacity $capacity req/s"
  for load in 50 85 95; do
    rate=$($PY -c "print(round($capacity * $load / 100, 2))")
    for run in 1 2; do
      $PY -m loadtest compare --spawn-server "$MODEL" --server-cpus "$server" --client-cpus "$client" \
        --rate "$rate" --duration "$DURATION" --mix "$MIX" --seed "$run" --no-plot \
        --results-dir "$OUT" --name "$name-load$load-run$run" > "$OUT/$name-load$load-run$run.log" 2>&1
      echo "$name load $load % ($rate req/s) run $run done"
    done
  done
done
