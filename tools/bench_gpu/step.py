"""One step of a GPU run: one runtime of one model, in a child process of its own.

    python -m tools.bench_gpu.step --prepared WORK/NAME.prepared.json --runtime R
        --runs N --warmup N --records FILE

A process per step, so that every runtime starts from nothing: its peak
memory is what it allocates itself (weights included), a crash or a hang is
its own, and the run can cut it off at its cap.  What it finds it prints at
once, one ``@@bench {json}`` line each, so a step cut off keeps what it
printed:

``measured``  the runtime's timing (``orchestrate.bench.run.measure``: the
              same input sets, warm-up, calls and clock as every runtime)
``verified``  for the bundle, after its timing: one random input set
              against the float64 reference (onnxruntime beside it), the verdict and each output's error
``records``   for the bundle, last: each distinct kernel of the plan timed
              alone where it runs in the plan (``Program.kernel_calls``;
              ``triton.testing.do_bench`` on a GPU), one record per kernel
              appended to ``--records`` in ``orchestrate records``' schema.
              The dry run times them with the host clock in the interpreter
              and marks every record ``fake``: not a GPU measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

TAG = "@@bench "


def emit(kind: str, payload) -> None:
    print(TAG + json.dumps({kind: payload}), flush=True)


def feed_sets(path: str, sets: int) -> list[dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as z:
        out: list[dict[str, np.ndarray]] = [{} for _ in range(sets)]
        for key in z.files:
            s, name = key.split("/", 1)
            out[int(s)][name] = z[key]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench_gpu.step")
    p.add_argument("--prepared", type=Path, required=True)
    p.add_argument("--runtime", required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--records", type=Path, required=True)
    args = p.parse_args(argv)
    prepared = json.loads(args.prepared.read_text())
    from orchestrate.bench import clock
    from orchestrate.bench.run import Settings, measure
    from orchestrate.bench.runtimes import ORCHESTRATE

    on_gpu = clock.cuda()
    feeds = feed_sets(prepared["inputs"], prepared["sets"])
    settings = Settings(args.runs, args.warmup, len(feeds), on_gpu=on_gpu)
    if args.runtime == ORCHESTRATE:
        return orchestrate_step(prepared, feeds, settings, args, on_gpu)
    from orchestrate.bench.torch_side import torch_runtimes

    name, size = prepared["counts"]["name"], prepared["size"]

    def module():
        from examples import build_model

        return build_model(name, size)[0], f"torch source (examples {name} {size})"

    make = torch_runtimes(
        module, prepared["input_names"], feeds, [args.runtime], prepared["dtype"], on_gpu
    )
    emit("measured", dataclasses.asdict(measure(args.runtime, make, len(feeds), settings, on_gpu)))
    return 0


def orchestrate_step(prepared: dict, feeds, settings, args, on_gpu: bool) -> int:
    import orchestrate
    from orchestrate import api
    from orchestrate.bench.run import measure
    from orchestrate.bench.runtimes import ORCHESTRATE, orchestrate_runtime
    from orchestrate.check import verify
    from orchestrate.plan import pipeline

    bundle = orchestrate.load(prepared["bundle"])
    made = measure(
        ORCHESTRATE,
        lambda key: orchestrate_runtime(bundle, feeds, prepared["optimize_s"]),
        len(feeds),
        settings,
        on_gpu,
    )
    emit("measured", dataclasses.asdict(made))
    # the answer, next to its timing
    src = prepared["model"]
    options = bundle.plan.options
    try:
        report = verify.verify(
            pipeline.load(src),
            bundle.graph,
            bundle.run,
            trials=1,
            rtol=api.default_rtol(options.dtype, options.tf32),
            source=src,
        )
    except Exception as e:  # noqa: BLE001 - a bundle that cannot answer did not verify
        emit(
            "verified",
            {
                "ok": False,
                "note": f"the bundle failed to run: {type(e).__name__}: {str(e)[:300]}",
                "errors": {},
            },
        )
    else:
        errors = {
            n: {"rel": c.rel, "max_abs": c.max_abs, "ok": c.ok} for n, c in report.worst().items()
        }
        bad = report.first_failure()
        note = report.verdict(1) + (f": output {bad.name!r}: {bad.detail}" if bad else "")
        emit("verified", {"ok": report.ok, "note": note, "errors": errors})
    try:
        emit("records", kernel_records(bundle, feeds[0], args.records, on_gpu))
    except Exception as e:  # noqa: BLE001 - the figures above stand without the records
        emit("records", {"error": f"{type(e).__name__}: {str(e)[:300]}"})
    return 0


def kernel_records(bundle, feeds, path: Path, on_gpu: bool) -> dict:
    """Each distinct kernel of the bundle's plan timed alone, where it runs
    in the plan; one record line each appended to ``path``."""
    import triton

    from orchestrate.cost.devices import get_device
    from orchestrate.tune.cache import Key, Row
    from orchestrate.tune.gpu import REP_MS, WARMUP_MS, driver_version
    from orchestrate.tune.records import describe, line, spec_dtype

    plan, graph = bundle.plan, bundle.graph
    device = get_device(plan.device)
    spec_of = {k.name: (k, s) for k, s in zip(plan.kernels, bundle.planned.specs)}
    program = bundle.program
    if on_gpu:
        import torch
        import triton.testing

        gpu, driver = torch.cuda.get_device_name(0), driver_version()
        method = (
            f"triton.testing.do_bench: median, {WARMUP_MS} ms warm-up, {REP_MS} ms of "
            "calls, L2 flushed before each; the kernel in place in the plan's buffers"
        )

        def timed(call) -> float:
            return (
                triton.testing.do_bench(call, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
                * 1e3
            )
    else:
        gpu, driver = "CPU (Triton interpreter)", "none"
        method = "host clock around the Triton interpreter on a CPU: not a GPU time"

        def timed(call) -> float:
            t = time.perf_counter()
            call()
            return (time.perf_counter() - t) * 1e6

    seen: set[str] = set()
    lines, total = [], 0.0
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for name, call in program.kernel_calls(feeds):
        kernel, spec = spec_of[name]
        if spec.hash in seen:
            continue
        seen.add(spec.hash)
        us = float(timed(call))
        total += us
        record = describe(graph, spec, device, 0) | {"method": method, "kernel": name}
        key = Key(spec.hash, gpu, spec_dtype(graph, spec), triton.__version__, driver)
        lines.append(line(Row(key, us, kernel.predicted_us, not on_gpu, now, record)))
    with open(path, "a") as f:
        for rec in lines:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    return {
        "kernels": len(lines),
        "measured_us": round(total, 3),
        "predicted_us": round(sum(r["predicted_us"] for r in lines), 3),
        "fake": not on_gpu,
        "method": method,
    }


if __name__ == "__main__":
    sys.exit(main())
