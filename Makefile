# Two set-up commands for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
MODEL  ?= models/default
ONNX   ?= build/onnx/default
HOST   ?= 0.0.0.0
PORT   ?= 8000

.PHONY: serve test lint onnx venv clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[export,dev]'
	touch $@

venv: $(VENV)/.installed

# Re-exported when the weights or the exporter change (the runtime refuses exports of another
# format version).
$(ONNX)/decoder.onnx: $(VENV)/.installed $(MODEL)/model.safetensors $(MODEL)/config.json $(wildcard export/*.py)
	$(PY) -m export --model $(MODEL) --output $(ONNX)

onnx: $(ONNX)/decoder.onnx

serve: onnx
	MT_MODEL_DIR=$(ONNX) $(PY) -m service --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

clean:
	rm -rf build
