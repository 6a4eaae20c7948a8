"""`make bench-launch`: the runner's own host cost per kernel launch.

    python -m examples.bench_launch [--kernels 200] [--repeats 15] [--limit 3.0]

A chain of ``--kernels`` tiny pointwise kernels (Relu and Add on a 4x8
tensor, one ONNX node per planned kernel) is run by a
``orchestrate.run.runtime.Program`` whose launchers are all no-ops, so Triton's
own dispatch is excluded: what is left is the runner's bookkeeping (buffers
from the pool, argument lists, the call).  µs per launch = the time of one
pass over the plan / the number of kernels, the median of ``--repeats``
repeats of many passes.  Two figures: ``execute`` times the kernel walk
alone (``Program._execute``), ``run`` the whole ``Program.run`` with torch
inputs (input checks and returning the outputs included, spread over the
kernels).  Exits 1 if ``execute`` exceeds ``--limit`` µs.

On a GPU it also times the real launchers (Triton's dispatch included,
without a CUDA graph) and a replayed CUDA graph.  Without one, the figures
are the host cost on this CPU; the kernels are never run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types

import numpy as np


def chain_model(kernels: int, shape=(4, 8)):
    """An ONNX model: ``kernels`` nodes, Relu and Add (with the input) in turn."""
    import onnx
    from onnx import TensorProto, helper

    nodes, last = [], "x"
    for i in range(kernels):
        out = f"t{i}"
        if i % 2 == 0:
            nodes.append(helper.make_node("Relu", [last], [out], name=f"relu{i}"))
        else:
            nodes.append(helper.make_node("Add", [last, "x"], [out], name=f"add{i}"))
        last = out
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info(last, TensorProto.FLOAT, list(shape))
    graph = helper.make_graph(nodes, "chain", [x], [y])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def build(kernels: int):
    """(graph, planned, kernels module source): one planned kernel per primitive."""
    from orchestrate.emit import emit
    from orchestrate.plan import pipeline
    from orchestrate.plan.planner import plan_sets

    graph = pipeline.fission_model(chain_model(kernels), None, "chain", option="shapes")
    planned = plan_sets(graph, [[n.name] for n in graph.nodes])
    return graph, planned, emit(graph, planned)


def _noop(*tensors, interpret=False):
    return None


def no_op_module(module) -> types.SimpleNamespace:
    """``module`` with every launcher replaced by one that does nothing."""
    return types.SimpleNamespace(
        KERNELS={k: (_noop, tensors) for k, (_, tensors) in module.KERNELS.items()}
    )


def per_launch(step, kernels: int, repeats: int, sync=None) -> float:
    """µs per kernel: the median over ``repeats`` of (time of one ``step()``) / ``kernels``."""
    step()  # warm
    n = 1
    while True:  # passes per repeat: about 50 ms
        t = time.perf_counter()
        for _ in range(n):
            step()
        if sync:
            sync()
        if time.perf_counter() - t > 0.05 or n >= 1 << 16:
            break
        n *= 2
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            step()
        if sync:
            sync()
        times.append((time.perf_counter() - t) / n)
    return statistics.median(times) / kernels * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.bench_launch")
    p.add_argument("--kernels", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--limit", type=float, default=3.0, help="µs per launch (default 3)")
    args = p.parse_args(argv)
    from orchestrate.run.runtime import Program, gpu_available, load_kernels

    gpu = gpu_available()
    graph, planned, source = build(args.kernels)
    module = load_kernels(source, interpret=not gpu)
    n = len(planned.plan.kernels)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)

    import torch

    device = "cuda" if gpu else "cpu"
    feeds = {"x": torch.from_numpy(x).to(device)}
    rows = []
    idle = Program(planned, graph, no_op_module(module), interpret=not gpu, cuda_graph=False)
    own = per_launch(lambda: idle._execute(dict(feeds)), n, args.repeats)
    rows.append(("runner only (no-op launchers)", "execute", own))
    rows.append(
        (
            "runner only (no-op launchers)",
            "run",
            per_launch(lambda: idle.run(feeds), n, args.repeats),
        )
    )
    if gpu:
        sync = torch.cuda.synchronize
        real = Program(planned, graph, module, interpret=False, cuda_graph=False)
        rows.append(
            (
                "Triton launchers, no CUDA graph",
                "execute",
                per_launch(lambda: real._execute(dict(feeds)), n, args.repeats, sync),
            )
        )
        rows.append(
            (
                "Triton launchers, no CUDA graph",
                "run",
                per_launch(lambda: real.run(feeds), n, args.repeats, sync),
            )
        )
        graphed = Program(planned, graph, module, interpret=False)
        graphed.run(feeds)  # compiles; the next run captures
        rows.append(
            (
                "CUDA graph replay",
                "run",
                per_launch(lambda: graphed.run(feeds), n, args.repeats, sync),
            )
        )
    where = torch.cuda.get_device_name() if gpu else "host cost on this CPU, kernels not run"
    print(f"launch overhead: {n} kernels ({where})")
    print(f"  {'':34} {'timed':8} {'µs/launch':>9}")
    for what, timed, us in rows:
        print(f"  {what:34} {timed:8} {us:9.2f}")
    if own > args.limit:
        print(
            f"the runner's own cost, {own:.2f} µs per launch, exceeds {args.limit:g} µs",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
