#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md § GPU, stage by stage, on a machine with an NVIDIA GPU
# and a Python that has onnxruntime-gpu, torch and the project's dependencies importable.
#
#   bench/gpu_session.sh env export cuda-tests parity profile peers   # then, separately:
#   bench/gpu_session.sh suite gpu-serve
#   bench/gpu_session.sh cpu-shapes
#
# The plots of BENCHMARKS.md are drawn from what comes back, on any machine:
#   python bench/shape_plots.py $RESULTS/scaling-cpu $RESULTS/serve-gpu --out bench/results
#
# Logs and JSON go to $RESULTS (default bench/results/gpu). Knobs: PY (default python3),
# WORK (exports; default build/onnx), SHORT=1 (shorter serving cells). Each stage runs under a
# time limit so one that hangs cannot eat the next one's time; a failing stage is reported and
# the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
RESULTS=${RESULTS:-bench/results/gpu}
WORK=${WORK:-build/onnx}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$RESULTS" "$WORK"

run_stage() {  # name, limit in seconds, function
  local name=$1 limit=$2 function=$3
  local started=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c "$function" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc $rc in $((SECONDS - started)) s"
  tail -n 25 "$RESULTS/$name.log"
  return 0
}

stage_env() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" - <<'PY'
import json, platform
import onnxruntime as ort
import torch
facts = {
    "python": platform.python_version(),
    "onnxruntime": ort.__version__,
    "available_providers": ort.get_available_providers(),
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "cudnn": torch.backends.cudnn.version(),
    "gpu": torch.cuda.get_device_name(0),
}
print(json.dumps(facts, indent=2))
PY
}

stage_export() {
  for model in default de-en; do
    [ -f "$WORK/$model/decoder.onnx" ] && [ -f "$WORK/$model-fp16/decoder.onnx" ] && continue
    "$PY" -m export --model "models/$model" --output "$WORK/$model" --fp16 || return 1
  done
  "$PY" - "$WORK/default/kv_select.onnx" <<'PY'
import sys
from service.runtime.onnx_model import cuda_is_usable
usable = cuda_is_usable(sys.argv[1])
print("cuda_is_usable:", usable)
sys.exit(0 if usable else 1)
PY
}

stage_cuda_tests() {
  "$PY" -m pytest -p no:cacheprovider -q -rs tests/runtime/test_engine_cuda.py tests/runtime/test_kv_backends.py \
    tests/runtime/test_device_kv_calls.py --junitxml="$RESULTS/cuda-tests.xml"
}

stage_parity() {
  "$PY" bench/gpu_parity.py --model models/default --fp32 "$WORK/default" \
    --fp16 "$WORK/default-fp16" --language en --limit 1000 --output "$RESULTS/parity-default.json" &&
  "$PY" bench/gpu_parity.py --model models/de-en --fp32 "$WORK/de-en" \
    --fp16 "$WORK/de-en-fp16" --language de --limit 1000 --output "$RESULTS/parity-de-en.json"
}

stage_profile() {
  # default-helpers: the export without its device decoder, as exports written before it (the
  # decoder plus kv_append / kv_select calls each step; docs/engine.md)
  mkdir -p "$WORK/default-helpers" &&
    find "$WORK/default" -maxdepth 1 -type f ! -name decoder_device.onnx \
      -exec cp {} "$WORK/default-helpers/" \; || return 1
  for variant in default default-helpers default-fp16; do
    "$PY" bench/step_split.py "$WORK/$variant" --provider cuda --threads 4 \
      --cells 1x1,1x8,1x32,4x32,1x128,4x128 --json "$RESULTS/step-split-$variant.json" || return 1
  done
}

stage_peers() {
  "$PY" bench/peers.py --device cuda --size base --batches 1,8,32,128 --per-system \
    --systems "${PEER_SYSTEMS:-ours,ours-fp16,transformers}" --threads 4 --repeats 2 \
    --results-dir "$RESULTS" --work-dir /tmp/peers-work
}

stage_suite() {
  # Left out: the browser (no Chromium), the deployment and Kubernetes manifests (their
  # validators are binaries not carried) and the runtime venv (it installs from PyPI, which
  # this machine cannot reach); they are not about the GPU and run in CI.
  "$PY" -m pytest -p no:cacheprovider -q -rs --timeout 300 \
    --ignore=tests/web/test_browser.py --ignore=tests/deploy \
    --junitxml="$RESULTS/suite.xml"
}

serve_shapes() {  # results dir, model, shapes...
  local results=$1 model=$2
  shift 2
  if [ "${SHORT:-1}" = 1 ]; then
    export DURATION=${DURATION:-10} RUNS=${RUNS:-1} CAPACITY_S=${CAPACITY_S:-15}
  fi
  RESULTS=$results MODEL=$model PY=$PY loadtest/machine_shapes.sh "$@" &&
  "$PY" -m loadtest.shapes_report "$results"
}

stage_gpu_serve() {
  # The server on 8 cores and the GPU, the load generator on the other 8; 120 % is past
  # saturation (throughput there is what each policy can carry).
  MT_PROVIDER=cuda LOADS=${LOADS:-50 85 120} CONCURRENCY=${CONCURRENCY:-128} \
    serve_shapes "$RESULTS/serve-gpu" "$WORK/default-fp16" "gpu:0-7:8-15"
}

stage_cpu_shapes() {
  # The server on 2, 4, 8 and 12 cores as `make serve` runs it, the load generator on the
  # last 4: capacity, p50/p99 at 85 %, CPU seconds per request by process kind.
  MT_PROVIDER=cpu "$PY" -m loadtest scaling \
    2core:0-1:12-15 4core:0-3:12-15 8core:0-7:12-15 12core:0-11:12-15 \
    --model "$WORK/default" --loads 85 --duration "${DURATION:-20}" --capacity-duration 15 \
    --project-cores 16 --results-dir "$RESULTS/scaling-cpu"
}

export PY RESULTS WORK
export -f stage_env stage_export stage_cuda_tests stage_parity stage_profile stage_peers \
  stage_suite serve_shapes stage_gpu_serve stage_cpu_shapes
for stage in "$@"; do
  case $stage in
    env) run_stage env 60 stage_env ;;
    export) run_stage export 240 stage_export ;;
    cuda-tests) run_stage cuda-tests 180 stage_cuda_tests ;;
    parity) run_stage parity 240 stage_parity ;;
    profile) run_stage profile 120 stage_profile ;;
    peers) run_stage peers 300 stage_peers ;;
    suite) run_stage suite 330 stage_suite ;;
    gpu-serve) run_stage gpu-serve 240 stage_gpu_serve ;;
    cpu-shapes) run_stage cpu-shapes 420 stage_cpu_shapes ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
