#!/usr/bin/env bash
# One lent-GPU session in one go: the `gpu` test tier (make test-gpu), the
# compile check of two bundles, and the GPU benchmark (make bench-gpu).
#
#   examples/gpu_session.sh [--dry-run]
#
# The device machine has python3 with torch, triton, onnx and onnxruntime, but
# no network, no pulp and not this project.  So build the wheels here first
# (make gpu-wheels: pure-Python ones and this project, under 60 MiB), and carry them along:
#
#   make gpu-wheels
#   device tool: run(command="examples/gpu_session.sh", carry=["wheels"], timeout_s=600)
#
# Each wheel is installed on its own, without dependencies, and one that does
# not fit the machine's Python is logged and skipped (the tier runs with
# --continue-on-collection-errors, so a test module it breaks does not stop
# the others).  Results go to $OUT (default out/gpu_session): a log per step
# and summary.txt, one line per step (name, exit status, seconds).  Every step
# runs within its own limit and what is left of SESSION_S (default 560 s,
# under the device tool's 600 s per command); a failed step does not stop the
# next.  --dry-run runs every step here on the CPU: pip only resolves the
# wheels (this .venv is left alone), the tier is collected and skipped, the
# compile check compiles for sm_90 without a GPU, the benchmark says it has no
# GPU (exit 2).
set -u
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = --dry-run ] && DRY=1
OUT=${OUT:-out/gpu_session}
PY=${PYTHON:-python3}
[ $DRY = 1 ] && [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
SESSION_S=${SESSION_S:-560}
mkdir -p "$OUT/bundles" "$OUT/models"
: >"$OUT/summary.txt"

step() { # step NAME SECONDS COMMAND: run COMMAND (bash) into $OUT/NAME.log
    local name=$1 limit=$2 cmd=$3 t0=$SECONDS rc
    local left=$((SESSION_S - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -le 0 ]; then
        rc=skipped
    else
        timeout "$limit" bash -c "$cmd" >"$OUT/$name.log" 2>&1
        rc=$?
    fi
    printf '%-13s rc=%-7s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
        "$(tail -n 1 "$OUT/$name.log" 2>/dev/null | cut -c1-100)" | tee -a "$OUT/summary.txt"
}

export PY OUT
step env 30 'nvidia-smi; $PY -c "import sys, torch, triton, onnx, onnxruntime as ort
print(sys.version.split()[0], torch.__version__, triton.__version__, onnx.__version__, ort.__version__)
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no CUDA\")"'

if [ $DRY = 1 ]; then
    step install 60 '$PY -m pip install --dry-run --no-index --no-deps wheels/*.whl'
else
    step install 90 'export PIP_BREAK_SYSTEM_PACKAGES=1
for w in wheels/*.whl; do
    $PY -m pip install -q --no-index --no-deps "$w" || echo "skipped $w"
done
$PY -c "import pulp, click, pytest, orchestrate; print(\"installed\")"'
fi

# make test-gpu, in parallel where pytest-xdist is there (Triton compiles ~300 kernels)
step test-gpu 330 'x=; $PY -c "import xdist" 2>/dev/null && x="-n $(($(nproc) < 8 ? $(nproc) : 8))"
$PY -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors $x \
    --junitxml=$OUT/test-gpu.xml'

step bundles 60 '$PY -m examples.build --out $OUT/models --only resnet && $PY -c "
import orchestrate
orchestrate.optimize(\"examples/models/tiny_bert.onnx\", \"$OUT/bundles/bert-fp16.orch\", dtype=\"fp16\", trials=0)
orchestrate.optimize(\"$OUT/models/tiny_resnet.onnx\", \"$OUT/bundles/resnet-fp32.orch\", trials=0)
print(\"2 bundles\")"'

step compile 60 'env -u TRITON_INTERPRET $PY -m orchestrate.emit.compile_check --json \
    $OUT/bundles/*.orch >$OUT/compile_check.json && \
env -u TRITON_INTERPRET $PY -m orchestrate.emit.compile_check $OUT/bundles/*.orch'

# make bench-gpu on two models (the whole suite takes a call of its own: make bench-gpu)
step bench-gpu 150 '$PY -m examples.bench_gpu --only bert resnet50 --budget 130'

echo "results in $OUT (summary.txt, one log per step)"
