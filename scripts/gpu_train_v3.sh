#!/usr/bin/env bash
# Train the v3 default models, both directions at once, on one GPU machine from carried token
# arrays, in stages with time limits (docs/training.md § v3).
#
#   bash scripts/gpu_train_v3.sh [STAGE...]        # default: env check train pack
#   SMOKE=1 bash scripts/gpu_train_v3.sh           # seconds-long dry run on the CPU
#
# ARRAYS   the carried folder made by `python -m models.training.arrays` (default build/arrays-v3)
# ARRAYS_TAR  the same folder as a carried `tar cJf` (it fits one call where the folder does not;
#          bench/gpu_carry.py): the check stage unpacks it beside ARRAYS when ARRAYS is missing
# RESUME   an earlier run's returned folders, <direction>/ with checkpoint.json + parts, or with
#          the best weights a session brought back (its <direction>.best.tar unpacked: the run
#          resumes from them, fresh moments; default build/v3-resume); WORK/<direction> wins
#          when present (same warm machine)
# WORK     where runs write on the machine's disk (default build/v3-runs: git-ignored, so a warm
#          machine keeps it between calls and a second call resumes from it)
# OUT      what comes back (default $OUT): per direction the best weights (fp16) as a tar in
#          15 MB parts, and runs.tgz (curves, logs, checkpoint records): at most 8 files
# MINUTES  training wall time per direction (default 8); ARCH (6x2-288), DIRECTIONS (en-de de-en)
# Python packages the GPU image lacks travel as wheels in .whl/ (docs/training.md).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
ARRAYS=${ARRAYS:-build/arrays-v3}
RESUME=${RESUME:-build/v3-resume}
WORK=${WORK:-build/v3-runs}
OUT=${OUT:-build/v3-out}
MINUTES=${MINUTES:-8}
ARCH=${ARCH:-6x2-288}
DIRECTIONS=${DIRECTIONS:-"en-de de-en"}
# Further train_v3 options, word-split on purpose (stages run in child shells: no arrays).
EXTRA=${EXTRA:-}
if [ "${SMOKE:-0}" = 1 ]; then
  ARCH=smoke MINUTES=3
  EXTRA="--device cpu --max-steps 4 --eval-every 4 --eval-sentences 2 --max-tokens 400
         --checkpoint-seconds 0 $EXTRA"
fi
ARRAYS_TAR=${ARRAYS_TAR:-}
export PYTHONUNBUFFERED=1 ARRAYS ARRAYS_TAR RESUME WORK OUT MINUTES ARCH DIRECTIONS PY EXTRA
mkdir -p "$WORK" "$OUT"

if ! $PY -c "import pydantic_settings, polib, sacrebleu" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PWD"
fi

run_stage() {  # name, limit in seconds, function
  local name=$1 limit=$2 function=$3 started=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c "$function" > "$WORK/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc $rc in $((SECONDS - started)) s"
  tail -n 15 "$WORK/$name.log"
  return $rc
}

stage_env() {
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no GPU"
  $PY -c "import torch, sacrebleu, sentencepiece; print(torch.__version__, torch.cuda.is_available())"
}

stage_check() {  # every part present and matching the manifest's SHA-256
  if [ ! -f "$ARRAYS/manifest.json" ] && [ -n "${ARRAYS_TAR:-}" ]; then
    mkdir -p "$(dirname "$ARRAYS")" && tar xJf "$ARRAYS_TAR" -C "$(dirname "$ARRAYS")" || return 1
  fi
  $PY -c "
import sys; from pathlib import Path
from models.training.arrays import load_examples
examples = load_examples(Path(sys.argv[1]))
print(len(examples), 'pairs,', examples.tokens.size, 'tokens')" "$ARRAYS"
}

stage_train() {  # both directions at once: a small model leaves most of the GPU idle
  for direction in $DIRECTIONS; do
    resume=()
    if [ -f "$WORK/$direction/checkpoint.json" ]; then resume=(--resume "$WORK/$direction")
    elif [ -f "$RESUME/$direction/checkpoint.json" ] || [ -f "$RESUME/$direction/best.json" ]; then
      resume=(--resume "$RESUME/$direction"); fi
    $PY -m models.training.train_v3 --arrays "$ARRAYS" --out "$WORK/$direction" \
      --direction "$direction" --arch "$ARCH" --max-minutes "$MINUTES" --threads 2 \
      "${resume[@]}" $EXTRA > "$WORK/$direction.stdout.log" 2>&1 &
  done
  rc=0
  for job in $(jobs -p); do wait "$job" || rc=1; done
  for direction in $DIRECTIONS; do tail -n 3 "$WORK/$direction.stdout.log"; done
  return $rc
}

stage_pack() {  # what comes back: <= 8 files of <= 16 MiB
  for direction in $DIRECTIONS; do
    [ -f "$WORK/$direction/best.json" ] || continue
    (cd "$WORK/$direction" && tar cf - best.json best.part-* history.json model_config.json run.json) |
      split -b 15M - "$OUT/$direction.best.tar.part-"
  done
  tar czf "$OUT/runs.tgz" -C "$WORK" --exclude='*.part-*' .
  ls -la "$OUT"
}
export -f stage_env stage_check stage_train stage_pack

STAGES=${*:-env check train pack}
for stage in $STAGES; do
  case $stage in
    env) run_stage env 60 stage_env ;;
    check) run_stage check 120 stage_check || exit 1 ;;
    train) run_stage train $(( ${MINUTES%.*} * 60 + 150 )) stage_train ;;
    pack) run_stage pack 120 stage_pack ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
