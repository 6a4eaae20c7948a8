"""The prepare step of one model: export, plan, count, and compile ahead.

    python -m tools.bench_gpu.prepare --model NAME --size SIZE --models DIR --work DIR
        [--dtype fp16] [--device h200] [--sets 4] [--arch 90] [--workers N] [--counts-only]

Run in a child per model, all models at once (CPU work: the GPU is not
touched).  It writes ``WORK/NAME.prepared.json``: the model's ``Counts``
(``projection.py``), its roofline floor, and where the bundle and the input
sets are; and prints one line per stage.  Stages:

1. the ONNX model exported (``examples.build``) into ``--models``, unless it
   is there already (its export time kept beside it, ``*.export.json``);
2. ``orchestrate.optimize`` with ``trials=0`` (verification comes later,
   on the GPU, next to the timings), into ``WORK/NAME.orch``;
3. the bundle loaded again (the kernels generated from its plan) and
   counted; the input sets (``orchestrate.check.verify.random_inputs``, seeds
   0..sets-1) saved to ``WORK/NAME.inputs.npz``;
4. onnxruntime's CPU session made and run once, and the torch module built,
   timed: what the verification and every torch baseline will pay;
5. with ``--arch``, every distinct Triton function of the bundle compiled
   for that architecture in a pool of ``--workers`` processes, into Triton's
   on-disk cache, where the first launch on the GPU finds it.

``--counts-only`` stops after 4 without saving inputs: the dry run's count
of the full-size models, for the projection.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench_gpu.prepare")
    p.add_argument("--model", required=True)
    p.add_argument("--size", required=True)
    p.add_argument("--models", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--device", default="h200")
    p.add_argument("--sets", type=int, default=4)
    p.add_argument("--arch", type=int, default=None)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--counts-only", action="store_true")
    args = p.parse_args(argv)
    name = args.model

    def say(text: str) -> None:
        print(f"{name}: {text}", flush=True)

    # 1. the ONNX model
    from examples.build import DEFAULT_OPSET, write_example

    args.models.mkdir(parents=True, exist_ok=True)
    src = args.models / f"{args.size}_{name}.onnx"
    stamp = src.with_suffix(".export.json")
    if src.exists() and stamp.exists():
        export_s = json.loads(stamp.read_text())["export_s"]
        say(f"exported already: {src} (took {export_s:.1f} s)")
    else:
        started = time.perf_counter()
        write_example(args.models, name, args.size, dynamo=False, opset=DEFAULT_OPSET, seed=0)
        export_s = time.perf_counter() - started
        stamp.write_text(json.dumps({"export_s": round(export_s, 2)}) + "\n")
        say(f"exported {src} in {export_s:.1f} s")
    # 2. the bundle
    import orchestrate
    from orchestrate.kernels.spec import LIBRARY, VIEW

    out = args.work / f"{name}.orch"
    started = time.perf_counter()
    made = orchestrate.optimize(
        src, out, dtype=args.dtype, device=args.device, trials=0, time_limit=20
    )
    optimize_s = time.perf_counter() - started
    say(
        f"optimized in {optimize_s:.1f} s: {made.plan.summary.kernels} kernels, predicted "
        f"{made.plan.summary.predicted_us:.1f} us on {made.plan.device}"
    )
    # 3. loaded again, counted, the input sets
    started = time.perf_counter()
    bundle = orchestrate.load(out, interpret=True)  # nothing runs here: no kernel is loaded
    load_s = time.perf_counter() - started
    specs = bundle.planned.specs
    functions = len({s.hash for s in specs if s.template not in (VIEW, *LIBRARY)})
    from orchestrate.bench.floor import roofline_floor
    from orchestrate.check.verify import random_inputs
    from orchestrate.cost.devices import get_device

    graph = bundle.graph
    floor = roofline_floor(graph, get_device(bundle.plan.device), tf32=bundle.plan.options.tf32)
    feeds = [random_inputs(graph, seed=s) for s in range(max(1, args.sets))]
    inputs = args.work / f"{name}.inputs.npz"
    if not args.counts_only:
        np.savez(inputs, **{f"{s}/{k}": v for s, f in enumerate(feeds) for k, v in f.items()})
    # 4. what the verification and the torch baselines will pay
    from orchestrate.frontend import onnxrt
    from orchestrate.plan import pipeline

    model = pipeline.load(src)
    started = time.perf_counter()
    session = onnxrt.reference(model, str(src))
    names = [o.name for o in session.get_outputs()]
    onnxrt.run_reference(session, names, feeds[0], str(src))
    verify_s = time.perf_counter() - started
    del session
    from examples import build_model

    started = time.perf_counter()
    build_model(name, args.size)
    build_s = time.perf_counter() - started
    say(
        f"loaded in {load_s:.1f} s, onnxruntime's check {verify_s:.1f} s, torch build "
        f"{build_s:.1f} s; {functions} distinct Triton functions"
    )
    # 5. compiled ahead
    compile_s, failed = None, 0
    if args.arch is not None and not args.counts_only:
        compile_s, failed = compile_bundle_ahead(out, args.arch, args.workers)
        say(
            f"compiled {functions} functions for sm_{args.arch} in {compile_s:.1f} s on "
            f"{args.workers} workers"
            + (f" ({failed} failed: the JIT tries again)" if failed else "")
        )
    counts = {
        "name": name,
        "nodes": len(model.graph.node),
        "weights_mb": round((out / "weights.npz").stat().st_size / 2**20, 1),
        "kernels": sum(1 for k in bundle.plan.kernels if not k.is_view),
        "functions": functions,
        "predicted_ms": bundle.plan.summary.predicted_us / 1e3,
        "export_s": round(export_s, 2),
        "optimize_s": round(optimize_s, 2),
        "load_s": round(load_s, 2),
        "verify_s": round(verify_s, 2),
        "build_s": round(build_s, 2),
        "compile_s": None if compile_s is None else round(compile_s, 2),
    }
    prepared = {
        "counts": counts,
        "dtype": bundle.plan.options.dtype,
        "bundle": str(out),
        "model": str(src),
        "size": args.size,
        "inputs": None if args.counts_only else str(inputs),
        "sets": len(feeds),
        "input_names": [i.name for i in graph.inputs],
        "optimize_s": optimize_s,
        "compile_failed": failed,
        "floor": dataclasses.asdict(floor),
    }
    (args.work / f"{name}.prepared.json").write_text(json.dumps(prepared, indent=1) + "\n")
    return 0


def compile_bundle_ahead(folder: Path, arch: int, workers: int) -> tuple[float, int]:
    """Every distinct Triton function of the bundle at ``folder`` compiled
    for ``arch``, one job per function in a pool of ``workers``: (wall
    seconds, how many failed)."""
    from orchestrate import bundle
    from orchestrate.bundle import regenerate
    from orchestrate.check.compile_check import library_launchers, tensor_dtypes
    from orchestrate.run.runtime import load_kernels
    from orchestrate.tune.gpu import compile_ahead

    contents = bundle.read(folder)
    source = regenerate.regenerate(
        contents.plan, contents.constants, contents.manifest["model"]["file"], str(folder)
    ).source
    module = load_kernels(source, interpret=False)  # read for its names: nothing is compiled
    library = set(library_launchers(module))
    names = sorted(
        {launch.__name__.removeprefix("launch_") for launch, _ in module.KERNELS.values()} - library
    )
    dtypes = tensor_dtypes(folder)
    started = time.perf_counter()
    errors = compile_ahead(
        [(source, dtypes, {n}) for n in names], arch, workers, lambda stage, i, n: None
    )
    for n, e in zip(names, errors):
        if e is not None:
            print(f"compile ahead: {n}: {e}", file=sys.stderr, flush=True)
    return time.perf_counter() - started, sum(e is not None for e in errors)


if __name__ == "__main__":
    sys.exit(main())
