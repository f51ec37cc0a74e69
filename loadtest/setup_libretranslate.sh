#!/usr/bin/env bash
# LibreTranslate 1.9.6 in its own venv, with our shipped models as its int8 Argos packages,
# for `python -m loadtest.compare_libretranslate run`. Downloads from PyPI (this script only;
# the comparison itself and the tests download nothing).
#
#   loadtest/setup_libretranslate.sh [LT_VENV] [LT_HOME]
#
# LT_VENV (default build/libretranslate/venv): the venv; LT_HOME (default
# build/libretranslate/home): the XDG folders LibreTranslate and Argos read and write.
set -euo pipefail
cd "$(dirname "$0")/.."
LT_VENV=${1:-build/libretranslate/venv}
LT_HOME=${2:-build/libretranslate/home}
PYTHON=${PYTHON:-python3.11}
if [ ! -x "$LT_VENV/bin/libretranslate" ]; then
    "$PYTHON" -m venv "$LT_VENV"
    # spaCy: the offline sentence splitter (ARGOS_CHUNK_TYPE=SPACY with a blank pipeline).
    "$LT_VENV/bin/pip" install -q "libretranslate==1.9.6" spacy
fi
mkdir -p "$LT_HOME"
# The conversion runs in our venv (torch and CTranslate2 read the checkpoints).
.venv/bin/python -m loadtest.compare_libretranslate --lt-venv "$LT_VENV" --lt-home "$LT_HOME" packages
