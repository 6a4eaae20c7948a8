"""`make bench-gpu`: optimize the base transformers and time them against onnxruntime.

    python -m examples.bench_runtime [--models bert gpt2 llama] [--cache out/bench]

Needs a CUDA GPU (the Triton interpreter would take hours and its times mean
nothing).  Each model is exported once (dynamo, opset 18, base sizes),
optimized for the GPU present (verified on one random trial), then timed with
`orchestrate bench`'s method: the bundle as a replayed CUDA graph, onnxruntime
with its CUDA provider and IO binding.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from examples.bench_plan import MODELS, export_cached


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.bench_runtime")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--cache", type=Path, default=Path("out/bench"))
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args(argv)
    from orchestrate import api, bench
    from orchestrate.runtime import gpu_available

    if not gpu_available():
        print("bench-gpu: no CUDA GPU here; nothing to measure", file=sys.stderr)
        return 2
    for name in args.models:
        src = export_cached(name, args.cache)
        out = args.cache / f"{name}.orch"
        if not out.exists():
            api.optimize(src, out, trials=1)
        loaded, model, graph = api.bundle_and_model(out, src)
        print(f"\n{name}:")
        for line in bench.table(bench.bench(loaded, model, graph, runs=args.runs), False):
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
