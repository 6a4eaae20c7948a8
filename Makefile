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
        conformance models bench-plan bench bench-gpu bench-gpu-dry bench-decode gpu-wheels bench-launch \
        hf-check fit-check dynamic-check peer-check measurements calibrate learn clean

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
	$(PY) -m pytest -n $(JOBS) --dist worksteal -q

test-slow: install
	$(PY) -m pytest -n $(JOBS) -q -m slow

# the gpu tier; on the GPU machine (no .venv, no network) with its python3 and
# the wheels beside it, within GPU_TEST_S seconds (default 240), its report
# into $$OUT when set:  device run(command="make test-gpu", carry=["wheels"])
GPU_TEST_S ?= 240
test-gpu:
	@if [ -x $(PY) ]; then $(MAKE) install && $(PY) -m pytest -q -m gpu; \
	else site=$$($(PYTHON) -m tools.bench_gpu.install) && \
		PYTHONPATH=$$site timeout -s INT $(GPU_TEST_S) $(PYTHON) -m pytest -q -m gpu -p no:cacheprovider \
		-n 8 --continue-on-collection-errors --junitxml=$${OUT:-out}/test-gpu.xml; fi

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
	$(PY) -m tests.emit.test_emit_golden --update

# pass / bound / declined counts over the ONNX node conformance cases
conformance: install
	$(PY) -m tests.conformance

# KernelBench's level 1 and 2 programs (a peer's suite: a checkout of
# ScalingIntelligence/KernelBench, which this project does not ship) shrunk,
# exported and optimized one by one; prints the counts (examples/kernelbench.py)
KERNELBENCH ?=
peer-check: install
	@test -n "$(KERNELBENCH)" || { echo "make peer-check: set KERNELBENCH=PATH, a checkout of ScalingIntelligence/KernelBench" >&2; exit 2; }
	mkdir -p out
	TRITON_INTERPRET=1 $(PY) -m examples.kernelbench $(KERNELBENCH) --levels 1,2 --json out/peer-check.jsonl

# KernelBench's published GPU timings as measurement rows (orchestrate/cost/
# measurements.py loads them): every timed level 1 and 2 program exported at its
# published size, one at a time, into data/measurements/kernelbench.jsonl.gz; the
# exports are cached in out/measurements/cache, so a stopped run resumes.
# KERNELBENCH is a git directory of ScalingIntelligence/KernelBench (a mirror will
# do: its history is read, not its work tree); MEASURE_ARGS adds --timeout S, ...
MEASURE_ARGS ?= --jobs 2
measurements: install
	@test -n "$(KERNELBENCH)" || { echo "make measurements: set KERNELBENCH=PATH, a git directory of ScalingIntelligence/KernelBench" >&2; exit 2; }
	$(PY) -m tools.measurements.kernelbench $(KERNELBENCH) --out data/measurements/kernelbench.jsonl.gz \
		--levels 1,2 $(MEASURE_ARGS)

# the benchmark suite at full size, random weights, no network (examples/suite.py
# lists it), into out/models: ~3 GB that any checkout rebuilds, so kept in the
# ignored out/ (make clean removes it); ARGS=--tiny writes the tiny variants
models: install
	$(PY) -m examples.suite $(ARGS)

# plan BERT-base, GPT-2 and a 24-layer decoder; print the planner table
bench-plan: install
	$(PY) -m examples.bench_plan

# the demo model optimized, against torch eager / torch.compile / onnxruntime
# (on a CPU: interpreter and CPU timings, for the mechanics only)
bench: install
	$(BIN)/orchestrate bench $(DEMO) --runs 5 --against eager,ort-cuda,ort-cpu

# the wheels the GPU machine lacks (PuLP, onnx2torch: pure Python) into the
# ignored wheels/, checked to fit what travels there; this project runs from
# its checkout
gpu-wheels: install
	mkdir -p wheels
	$(PY) -m pip download -q --no-deps --only-binary :all: -d wheels pulp onnx2torch
	$(PY) -m tools.bench_gpu.install --check --wheels wheels

# ONE GPU run, at most 540 s of wall time (ARGS=--budget S): BERT-base, GPT-2,
# the Llama-style decoder and ResNet-50 at fp16, batch 1, the bundle verified
# and timed against torch eager, torch.compile and max-autotune, breadth
# first; at most 8 files into $$OUT (else out/bench-gpu): results.json and
# results.md (rewritten after every figure), chart.png, records.jsonl,
# projection.json, bench.log.  On the GPU machine (no .venv, no network) it
# runs its python3, PuLP and onnx2torch installed from wheels/ beside its
# packages:  device run(command="make bench-gpu", carry=["wheels"], timeout_s=600)
bench-gpu:
	@if [ -x $(PY) ]; then $(MAKE) install && $(PY) -m tools.bench_gpu $(ARGS); \
	else $(PYTHON) -m tools.bench_gpu $(ARGS); fi

# decoding speed, after bench-gpu where time is left: the decode step's tokens
# a second in place, over its concat and in torch eager (tools/bench_decode.py),
# into $$OUT (else out/bench-decode)/decode.json.  On the GPU machine:
#   device run(command="make bench-decode", carry=["wheels"], timeout_s=600)
bench-decode:
	@if [ -x $(PY) ]; then $(MAKE) install && $(PY) -m tools.bench_decode $(ARGS); \
	else site=$$($(PYTHON) -m tools.bench_gpu.install) && \
		PYTHONPATH=$$site $(PYTHON) -m tools.bench_decode $(ARGS); fi

# the same steps on this CPU: the offline install proven, the full-size models
# exported and planned here to project the real run (printed; exit 2 when it
# would overrun 540 s), then every step over the tiny models in the
# interpreter; files into $$OUT, else out/bench-dry
bench-gpu-dry: gpu-wheels
	$(PY) -m pip install -q 'matplotlib>=3.7'
	$(PY) -m tools.bench_gpu --dry-run $(ARGS)

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
	$(PY) -m tools.fit_sweep $(FIT_ARGS)

# the examples exported with dynamic batch / sequence axes by both exporters, each
# optimized once for a range (DYNAMIC_ARGS, default --range 1..8x2..64) and run at
# MIN, MAX and random shapes against onnxruntime, priced at OPT against a static
# plan; writes out/dynamic/dynamic.md (tens of minutes in the CPU interpreter)
dynamic-check: install
	$(PY) -m examples.ranges $(DYNAMIC_ARGS)

# the cost model against published GPU measurements (data/measurements):
# per GPU, runtime and kind, the geometric mean of predicted / measured, the
# error factor, Spearman and the share within 2x; a scatter plot and every
# row's prediction into out/calibrate (ARGS: --gpu h100, --runtime eager, ...);
# about 10 minutes on 2 cores for all 9,919 rows
calibrate: install
	$(PY) -m pip install -q 'matplotlib>=3.7'
	mkdir -p out/calibrate
	$(BIN)/orchestrate calibrate --jobs $(JOBS) $(ARGS) --plot out/calibrate/scatter.png \
		--json out/calibrate/predictions.json

# the learned cost model retrained on every row into the package (what --cost
# learned reads), its leave-one-GPU-out study and the figures in docs/images;
# RECORDS=FILE (make bench-gpu's records.jsonl, orchestrate records export)
# joins our own kernels' records to the rows
learn: install
	$(PY) -m pip install -q 'matplotlib>=3.7'
	$(BIN)/orchestrate calibrate --jobs $(JOBS) --plot docs/images/calibrate-scatter.png \
		--train orchestrate/cost/learned.json --transfer --curves docs/images/learning-curves.png \
		--pca docs/images/pca.png $(foreach r,$(RECORDS),--records $(r))

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
