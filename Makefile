# Two set-up commands for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Every shipped model: a directory under models/ with weights (models/default is en→de); each
# is exported to build/onnx/<name> and `make serve` serves them all (MT_EXPORTS).
SHIPPED := $(patsubst models/%/model.safetensors,%,$(wildcard models/*/model.safetensors))
EXPORTS := $(foreach name,$(SHIPPED),build/onnx/$(name))
comma  := ,
space  := $(subst ,, )
# The server's address: MT_HOST and MT_PORT as `python -m service` reads them, or HOST and PORT
# (`make serve PORT=9000`).
HOST   ?= $(or $(MT_HOST),0.0.0.0)
PORT   ?= $(or $(MT_PORT),8000)
# Where `python -m service models pull` installs models (its default: MT_MODELS_DIR, else
# MT_DATA_DIR/models); `make serve` serves them beside the shipped ones, and a pulled model
# replaces a shipped model of its pair.
MT_MODELS_DIR ?= $(or $(MT_DATA_DIR),data)/models

.PHONY: serve test lint typecheck onnx venv clean fuzz pull

# Two install stamps: serving needs the runtime and the exporter (torch, to build the ONNX
# files once); the tests, the linters and the type checker add the dev extras on top.
$(VENV)/.installed-serve: pyproject.toml constraints.txt
	@echo "==> creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@echo "==> installing PyTorch for the ONNX export (a few minutes)"
	$(PIP) install -q torch==2.13.0
	@echo "==> installing the service and the exporter"
	$(PIP) install -q -c constraints.txt -e '.[export]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-serve
	@echo "==> installing the test, lint and type-check tools"
	$(PIP) install -q -c constraints.txt -e '.[export,dev,postgres]'
	touch $@

venv: $(VENV)/.installed-dev

# Re-exported when the weights or the exporter change (the runtime refuses exports of another
# format version).
build/onnx/%/decoder.onnx: $(VENV)/.installed-serve models/%/model.safetensors models/%/config.json $(wildcard export/*.py) $(wildcard models/*.py)
	@echo "==> exporting models/$* to ONNX"
	$(PY) -m export --model models/$* --output build/onnx/$*

onnx: $(addsuffix /decoder.onnx,$(EXPORTS))

serve: onnx
	mkdir -p $(MT_MODELS_DIR)
	MT_EXPORTS=$(subst $(space),$(comma),$(EXPORTS)) MT_MODELS_DIR=$(MT_MODELS_DIR) \
		$(PY) -m service --host $(HOST) --port $(PORT)

# A model by name into MT_MODELS_DIR, which `make serve` serves (docs/models.md):
# `make pull MODEL=opus-mt-en-fr`. The venv is created first on a fresh machine.
pull: $(VENV)/.installed-serve
	@test -n "$(MODEL)" || { echo "usage: make pull MODEL=opus-mt-en-fr (docs/models.md)"; exit 2; }
	$(PY) -m service models --models-dir $(MT_MODELS_DIR) pull $(MODEL)

# The type checker over the service and the exporter (settings in pyproject.toml [tool.mypy]);
# `lint` and `test` (what CI runs) both run it.
TYPECHECK := $(PY) -m mypy service export

typecheck: $(VENV)/.installed-dev
	$(TYPECHECK)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(TYPECHECK)

test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(TYPECHECK)
	$(PY) -m pytest -q

clean:
	rm -rf build

# Long property-based fuzz run (schemathesis against the OpenAPI schema, every operation,
# MT_FUZZ_EXAMPLES cases each); the count of cases sent is written to build/fuzz/report.json.
FUZZ_EXAMPLES ?= 1500
fuzz: $(VENV)/.installed-dev
	MT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) MT_FUZZ_REPORT=build/fuzz/report.json \
		$(PY) -m pytest -q tests/system/test_fuzz.py
	cat build/fuzz/report.json
