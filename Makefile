# orchestrate: ONNX -> operator fission -> optimal fused Triton kernels.
#   make demo    set up, then optimize + verify the shipped example model
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
DEMO   := examples/models/tiny_bert.onnx

.PHONY: install demo test test-slow test-gpu fuzz lint format examples golden-update \
        conformance models bench-plan bench bench-gpu bench-launch hf-check fit-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/orchestrate inspect $(DEMO)
	mkdir -p out
	$(BIN)/orchestrate optimize $(DEMO) -o out/tiny_bert.orch
	$(BIN)/orchestrate verify out/tiny_bert.orch --model $(DEMO)

test: install
	$(PY) -m pytest -n $(JOBS) -q

test-slow: install
	$(PY) -m pytest -n $(JOBS) -q -m slow

test-gpu: install
	$(PY) -m pytest -q -m gpu

# the fuzz suite (tests/test_fuzz.py) with many random examples per property
# instead of make test's few fixed ones; failures are kept in .hypothesis/ and
# replayed first next time.  FUZZ_ARGS=--runxfail shows the known failures
# too; ORCHESTRATE_FUZZ_SKIP_KNOWN=1 discards examples that hit them.
fuzz: install
	ORCHESTRATE_FUZZ=1 $(PY) -m pytest -n $(JOBS) -q tests/test_fuzz.py \
		--hypothesis-show-statistics $(FUZZ_ARGS)

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# the shipped demo model (examples/models/tiny_bert.onnx)
examples: install
	$(PY) -m examples.build --out examples/models --only bert

golden-update: install
	$(PY) -m tests.test_emit_golden --update

# pass / bound / declined counts over the ONNX node conformance cases
conformance: install
	$(PY) -m tests.conformance

# the benchmark suite at full size, random weights, no network (examples/suite.py
# lists it), into out/models: ~3 GB that any checkout rebuilds, so kept in the
# ignored out/ (make clean removes it); ARGS=--tiny writes the tiny variants
models: install
	$(PY) -m examples.suite $(ARGS)

# plan BERT-base, GPT-2 and a 24-layer decoder; print the planner table
bench-plan: install
	$(PY) -m examples.bench_plan

# the demo bundle against onnxruntime (on a CPU: interpreter, for the mechanics only)
bench: demo
	$(BIN)/orchestrate bench out/tiny_bert.orch --model $(DEMO) --runs 5

# base transformers against onnxruntime's CUDA provider (needs a GPU)
bench-gpu: install
	$(PY) -m examples.bench_runtime

# the runner's own host cost per kernel launch, kernels replaced by no-ops (fails over 3 µs)
bench-launch: install
	$(PY) -m examples.bench_launch

# Hugging Face architectures from configs (random weights, no download) through
# optimize + verify; transformers is installed for this target only
HF := transformers==5.24.0
hf-check: install
	$(PY) -m pip install -q $(HF)
	HF_HUB_OFFLINE=1 $(PY) -m examples.hf_models

# every example and hf-check architecture planned for a GPU (FIT_ARGS, default
# --device h200 at fp32 and fp16, tiny sizes; add --sizes tiny base) and each
# kernel compiled for its architecture and checked against its limits (no GPU)
fit-check: install
	$(PY) -m pip install -q $(HF)
	$(PY) -m examples.fit_sweep $(FIT_ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
