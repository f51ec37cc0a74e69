#!/usr/bin/env bash
# Train the default models on one GPU machine in one command: every candidate architecture for
# both directions at once, then finalise each, choose one architecture per direction by
# measurement (models/training/choose.py) and pack the chosen models for the trip back.
#
#   bash scripts/train_default_models.sh PACK.tgz OUT_DIR [MINUTES]
#
# PACK.tgz: the corpus splits (*.tsv) and the joint tokenizer (tokenizer/), made on the corpus
# machine by:   tar czf build/corpus_pack.tgz -C build/corpus train.tsv valid.tsv test.tsv \
#                   test-unseen.tsv tokenizer
# Python packages the GPU image lacks (pydantic-settings, polib, …) travel as wheels in .whl/
# (see docs/training.md). OUT_DIR receives, per direction, the chosen model as a tarball split
# into 15 MB parts, plus every run's training curve and log (runs.tgz). Candidates' speeds come
# from bench/results/arch_speed.json, measured on the serving CPU beforehand.
set -euo pipefail
PACK=$1
OUT_DIR=$2
MINUTES=${3:-7}
ARCHS=${ARCHS:-"4x3-256 6x2-256 6x2-288"}
DIRECTIONS=${DIRECTIONS:-"en-de de-en"}
WORK=${WORK:-/tmp/mt-train}
PYTHON=${PYTHON:-python3}

SPEED=${SPEED:-bench/results/arch_speed.json}

if ! $PYTHON -c "import pydantic_settings, polib" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" .whl/*.whl
    export PYTHONPATH="$WORK/site:$PWD"
fi
export PYTHONUNBUFFERED=1
mkdir -p "$WORK/corpus" "$OUT_DIR"
tar xzf "$PACK" -C "$WORK/corpus"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

# Every (direction, architecture) run in its own process on the one GPU: small models leave
# most of an H100 idle, so concurrent runs cost little more than one. Two CPU threads each for
# the data pipeline and the CPU-side validation decoding.
for direction in $DIRECTIONS; do
    for arch in $ARCHS; do
        run="$WORK/runs/$direction-$arch"
        mkdir -p "$run"
        init=()  # INIT_DIR: models of an earlier run to continue from (fresh optimizer)
        if [ -n "${INIT_DIR:-}" ] && [ -d "$INIT_DIR/$direction-$arch" ]; then
            init=(--init-from "$INIT_DIR/$direction-$arch")
        fi
        $PYTHON -m models.training.train --corpus "$WORK/corpus" --out "$run" \
            --direction "$direction" --arch "$arch" --max-minutes "$MINUTES" --threads 2 \
            --eval-every "${EVAL_EVERY:-0}" "${init[@]}" >"$run/stdout.log" 2>&1 &
    done
done
wait
for direction in $DIRECTIONS; do
    for arch in $ARCHS; do
        run="$WORK/runs/$direction-$arch"
        $PYTHON -m models.training.train --corpus "$WORK/corpus" --out "$run" \
            --direction "$direction" --finalize "$WORK/models/$direction-$arch" --threads 2 \
            >>"$run/stdout.log" 2>&1 &
    done
done
wait

for direction in $DIRECTIONS; do
    runs=()
    for arch in $ARCHS; do runs+=("$WORK/runs/$direction-$arch"); done
    $PYTHON -m models.training.choose --speed "$SPEED" --trained "${runs[@]}" \
        | tee "$WORK/runs/choice-$direction.json"
    chosen=$($PYTHON -c "import json,sys;print(json.load(open(sys.argv[1]))['chosen'])" \
        "$WORK/runs/choice-$direction.json")
    tar cf - -C "$WORK/models" "$direction-$chosen" | split -b 15M - "$OUT_DIR/$direction.tar.part-"
done
# Curves, choices and logs of every run (no weights).
tar czf "$OUT_DIR/runs.tgz" -C "$WORK/runs" --exclude='*.pt' .
ls -la "$OUT_DIR"
