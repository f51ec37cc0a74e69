#!/usr/bin/env bash
# A separate venv for Optimum's ONNX Runtime seq2seq classes, which do not import with
# transformers 5.x (docs/toolchain.md): pip resolves transformers 4.57.6 here. torch is installed
# first and pinned by constraints.txt so the CPU wheel is never replaced by a CUDA build.
# Usage (from the repository root): bash bench/setup_optimum.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=bench/.venv-optimum
python3.11 -m venv "$VENV"
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install -c "$PWD/constraints.txt" 'optimum-onnx[onnxruntime]'
