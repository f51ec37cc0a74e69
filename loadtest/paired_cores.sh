#!/usr/bin/env bash
# One-core A/B with paired seeds, on a machine with many cores: N pairs at once, server on core
# k and generator on core k + N (taskset), each pair an interleaved `compare` of continuous
# against static batching on its own seed. Pairs 0..N/2-1 run arm A, the rest arm B, so both
# arms' ratios to static are paired with a static run on the same seed at the same time. On a
# 2-vCPU VM one cell is one noisy sample (the same build's p99 ratio ranged 0.58-1.54); eight
# paired seeds an arm tell 10-30 % apart. Summarise with
#   .venv/bin/python -m loadtest.paired_report $RESULTS
# Usage: A="MT_X=1" B="MT_X=2" loadtest/paired_cores.sh
# Knobs (environment): PY, MODEL, PAIRS (8: cores 0-15), LOADS ("85 95 50"), SEEDS_FROM (1),
# DURATION (30), CAP (req/s a core; else the median of PAIRS closed loops), MIX, RESULTS.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:-build/onnx/default}
PAIRS=${PAIRS:-8}
MIX=${MIX:-ui=0.8,help=0.2}
RESULTS=${RESULTS:-loadtest/results/paired}
export MT_PROVIDER=${MT_PROVIDER:-cpu}
mkdir -p "$RESULTS"
half=$((PAIRS / 2))
cap=${CAP:-}
if [ -z "$cap" ]; then
  for ((k = 0; k < PAIRS; k++)); do
    $PY -m loadtest closed --spawn-server "$MODEL" --server-cpus $k --client-cpus $((k + PAIRS)) \
      --concurrency 32 --duration 20 --mix "$MIX" --no-plot --results-dir "$RESULTS" \
      --name "capacity$k" > "$RESULTS/capacity$k.log" 2>&1 &
  done
  wait
  cap=$($PY -c "import json, statistics; print(statistics.median(json.load(open('$RESULTS/capacity%d.json' % k))['summary']['throughput_rps'] for k in range($PAIRS)))")
fi
echo "capacity $cap req/s a core"
for load in ${LOADS:-85 95 50}; do
  rate=$($PY -c "print(round($cap * $load / 100, 2))")
  for ((k = 0; k < PAIRS; k++)); do
    if ((k < half)); then arm=A envs=${A:-}; else arm=B envs=${B:-}; fi
    seed=$((k % half + ${SEEDS_FROM:-1}))
    flags=()
    for env in $envs; do flags+=(--server-env "$env"); done
    $PY -m loadtest compare --spawn-server "$MODEL" --server-cpus $k --client-cpus $((k + PAIRS)) \
      --rate "$rate" --duration "${DURATION:-30}" --mix "$MIX" --seed $seed --no-plot \
      --interleave 4 "${flags[@]}" --results-dir "$RESULTS" --name "$arm-load$load-seed$seed" \
      > "$RESULTS/$arm-load$load-seed$seed.log" 2>&1 &
  done
  wait
  echo "load $load % ($rate req/s) done"
done
