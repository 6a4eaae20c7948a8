# orchestrate: ONNX -> operator fission -> optimal fused Triton kernels.
#   make demo    set up, then optimize the shipped example model
#   make test    set up, then run the test suite (fast CPU tier)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch is pinned and installed before the project: an unpinned torch (or
# anything pulling torchvision) drags in a multi-GB CUDA build.
TORCH  := torch==2.13.0
JOBS   ?= 2

.PHONY: install demo test test-slow test-gpu lint format examples clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

examples: install
	$(PY) -m examples.build --out examples/models

demo: install
	$(BIN)/orchestrate inspect examples/models/tiny_bert.onnx
	$(BIN)/orchestrate decompose examples/models/tiny_bert.onnx -o out/tiny_bert.prim.onnx

test: install
	$(PY) -m pytest -n $(JOBS) -q

test-slow: install
	$(PY) -m pytest -n $(JOBS) -q -m slow

test-gpu: install
	$(PY) -m pytest -q -m gpu

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
