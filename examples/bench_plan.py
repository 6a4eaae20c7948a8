"""`make bench-plan`: plan the benchmark models and print two tables.

    python -m examples.bench_plan [--models bert gpt2 llama chain-1000 ...]
                                  [--cache out/bench] [--device h200] [--half]

Each model is exported once (torch.onnx.export with dynamo=True, opset 18,
"base" sizes: BERT-base seq 128, GPT-2 small seq 128, the 24-layer
Llama-style decoder) into the cache folder, then planned in a fresh process
so that its wall time and peak resident memory are its own.  ``--half``
exports the model in fp16 instead (``model.half()``, the TorchScript
exporter at opset 17: the torch.export path does not trace half-precision
CPU models reliably).

The second table splits each plan's predicted time: the share that is
launch overhead (kernels x ``cost.figures.LAUNCH_US``), and the share in
kernels whose roof is memory, compute or latency (the largest of the three
terms of ``cost/roofline.py``).  All of it is the cost model's prediction.

The generated graphs (``examples/generated.py``: elementwise chains and
100-branch wide graphs of 1,000, 3,000 and 10,000 nodes) measure how
planning time grows with the graph.

Targets (2 CPU cores): each plan under 60 s and 2 GiB, every partition
optimal, the ILP strictly below greedy on the transformers, and planning
time per node of the largest generated graph of each kind at most 1.5x
that of the smallest (about linear growth).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("bert", "gpt2", "llama")
GENERATED = tuple(f"{kind}-{n}" for kind in ("chain", "wide") for n in (1000, 3000, 10000))
LINEAR_SLACK = 1.5  # time per node, largest over smallest generated graph of a kind
TARGET_SECONDS = 60.0
TARGET_RSS_GIB = 2.0


def export_cached(name: str, cache: Path, half: bool = False) -> Path:
    from examples import export_example

    path = cache / (f"base_{name}_fp16_ts17.onnx" if half else f"base_{name}_dynamo18.onnx")
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        how = "fp16, TorchScript, opset 17" if half else "dynamo, opset 18"
        print(f"exporting {name} (base, {how}) to {path} ...", file=sys.stderr)
        if half:
            export_half(name, tmp)
        else:
            export_example(name, tmp, dynamo=True, opset=18, size="base")
        for extra in tmp.parent.glob(tmp.name + "*.data"):
            extra.unlink()
        tmp.rename(path)
    return path


def export_half(name: str, path: Path) -> None:
    """The example at base size in fp16 (weights and float inputs)."""
    import torch

    from examples import build_model, export, random_inputs

    model, inputs = build_model(name, "base", 0)
    model = model.half().eval()
    feeds = random_inputs(inputs, 0)
    args = [torch.from_numpy(feeds[i.name]) for i in inputs]
    args = [a.half() if a.is_floating_point() else a for a in args]
    export(
        model,
        args,
        path,
        dynamo=False,
        opset=17,
        input_names=[i.name for i in inputs],
        output_names=list(model.OUTPUTS),
    )


def breakdown(graph, planned, device: str) -> dict:
    """Shares of the predicted time: launch overhead, and kernels by roof."""
    from orchestrate.cost.devices import get_device
    from orchestrate.cost.figures import LAUNCH_US
    from orchestrate.cost.roofline import cost

    dev = get_device(device)
    total = planned.plan.summary.predicted_us
    roofs = {"memory": 0.0, "compute": 0.0, "latency": 0.0}
    kernels = 0
    for k, spec in zip(planned.plan.kernels, planned.specs):
        if k.is_view:
            continue
        kernels += 1
        c = cost(graph, spec, dev)
        terms = {"memory": c.memory_us, "compute": c.compute_us, "latency": c.latency_us}
        roof = max(terms, key=terms.get)
        roofs[roof] += k.predicted_us - c.launch_us
    shares = {f"{r}_share": round(v / total, 3) for r, v in roofs.items()}
    return {"launch_share": round(kernels * LAUNCH_US / total, 3), **shares}


def plan_one(path: Path, device: str | None = None) -> dict:
    """Run in a child process: plan ``path`` and report time, memory, plan summary."""
    from orchestrate import frontend
    from orchestrate.decompose import fission
    from orchestrate.emit import function_key
    from orchestrate.plan import pipeline
    from orchestrate.plan.planner import PlanOptions

    started = time.perf_counter()
    model = pipeline.load(path)
    nodes = len(model.graph.node)
    prepared = frontend.prepare(model, None, str(path))
    del model
    graph = fission(prepared, str(path), consume=True)
    del prepared
    planned = pipeline.plan_graph(graph, PlanOptions(device=device))
    plan = planned.plan
    wall = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = plan.to_json()
    return {
        "nodes": nodes,
        "primitives": len(result["primitives"]),
        "functions": len(
            {function_key(k.hash, k.primitives, k.outputs) for k in plan.kernels if not k.is_view}
        ),
        "solver": result["solver"],
        "summary": result["summary"],
        "baselines": result["baselines"],
        "device": plan.device,
        "breakdown": breakdown(graph, planned, plan.device),
        "wall_s": round(wall, 1),
        "rss_bytes": rss,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m examples.bench_plan", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--models", nargs="+", default=list(MODELS + GENERATED), choices=MODELS + GENERATED
    )
    p.add_argument("--cache", type=Path, default=Path("out/bench"))
    p.add_argument(
        "--device", default=None, help="GPU to plan for (default: the cost model's h100)"
    )
    p.add_argument("--half", action="store_true", help="export the models in fp16")
    p.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--export", choices=MODELS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(plan_one(args.one, args.device)))
        return 0
    if args.export:
        export_cached(args.export, args.cache, args.half)
        return 0
    rows = []
    for name in args.models:
        if name in GENERATED:
            rows.append((name, plan_child(generated(name, args.cache), args.device)))
            continue
        # exported in a child too: a child forked from a parent that held the
        # torch model would start from the parent's peak RSS (Linux keeps
        # ru_maxrss across fork), and the planner's figure would include it
        half = ["--half"] if args.half else []
        subprocess.run(
            [
                sys.executable,
                "-m",
                "examples.bench_plan",
                "--export",
                name,
                "--cache",
                str(args.cache),
                *half,
            ],
            check=True,
        )
        rows.append((name, plan_child(export_cached(name, args.cache, args.half), args.device)))
    print(table(rows))
    print()
    print(shares_table(rows))
    growth = growth_lines(rows)
    if growth:
        print()
        print("\n".join(growth))
    failed = [(name, reasons(name, r)) for name, r in rows if reasons(name, r)]
    failed += [("growth", [line]) for line in growth if "MISSED" in line]
    for name, why in failed:
        print(f"TARGET MISSED: {name}: {why}", file=sys.stderr)
    return 1 if failed else 0


def generated(name: str, cache: Path) -> Path:
    """The generated graph ``name`` (kind-nodes) in the cache folder."""
    import onnx

    from examples.generated import build

    kind, n = name.split("-")
    path = cache / f"generated_{kind}{n}.onnx"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        onnx.save(build(kind, int(n)), path)
    return path


def plan_child(path: Path, device: str | None) -> dict:
    """``plan_one`` in a fresh process, so that its time and peak memory are its own."""
    extra = ["--device", device] if device else []
    out = subprocess.run(
        [sys.executable, "-m", "examples.bench_plan", "--one", str(path), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        raise SystemExit(1)
    return json.loads(out.stdout.strip().splitlines()[-1])


def growth_lines(rows) -> list[str]:
    """Per generated kind measured at two sizes or more: planning seconds per
    node of the largest over the smallest, against LINEAR_SLACK."""
    by_kind: dict[str, list[tuple[int, float]]] = {}
    for name, r in rows:
        if name in GENERATED:
            by_kind.setdefault(name.split("-")[0], []).append((r["nodes"], r["wall_s"]))
    out = []
    for kind, sizes in sorted(by_kind.items()):
        if len(sizes) < 2:
            continue
        (n0, t0), (n1, t1) = min(sizes), max(sizes)
        ratio = (t1 / n1) / (t0 / n0) if t0 > 0 else float("inf")
        verdict = "ok" if ratio <= LINEAR_SLACK else "MISSED"
        times = ", ".join(f"{n} nodes {t} s" for n, t in sorted(sizes))
        out.append(
            f"growth {kind}: {times}; per node {ratio:.2f}x of the smallest "
            f"(target <= {LINEAR_SLACK}x): {verdict}"
        )
    return out


def reasons(name: str, r: dict) -> list[str]:
    out = []
    if r["wall_s"] >= TARGET_SECONDS:
        out.append(f"{r['wall_s']} s >= {TARGET_SECONDS} s")
    if r["rss_bytes"] >= TARGET_RSS_GIB * 2**30:
        out.append(f"peak RSS {r['rss_bytes'] / 2**30:.2f} GiB")
    if r["solver"]["status"] != "optimal":
        out.append(f"solver status {r['solver']['status']}")
    no_gain = r["summary"]["predicted_us"] >= r["baselines"]["greedy"]["predicted_us"]
    if name in MODELS and no_gain:  # (a generated chain fuses as greedy fuses it)
        out.append("ILP not below greedy")
    return out


def table(rows) -> str:
    head = (
        "| model | ONNX nodes | primitives | candidates | partitions (unique) | solver s | status "
        "| kernels unfused / greedy / ILP | jitted functions | predicted us unfused / greedy / ILP "
        "| MB moved unfused / greedy / ILP | ILP vs greedy | wall s | peak RSS |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in rows:
        u, g, s = r["baselines"]["unfused"], r["baselines"]["greedy"], r["summary"]
        sol = r["solver"]
        lines.append(
            f"| {name} | {r['nodes']} | {r['primitives']} | {sol['candidates']} "
            f"| {sol['partitions']} ({sol['unique_partitions']}) | {sol['seconds']} | {sol['status']} "
            f"| {u['kernels']} / {g['kernels']} / {s['kernels']} | {r['functions']} "
            f"| {u['predicted_us']:.1f} / {g['predicted_us']:.1f} / {s['predicted_us']:.1f} "
            f"| {u['bytes'] / 1e6:.0f} / {g['bytes'] / 1e6:.0f} / {s['bytes'] / 1e6:.0f} "
            f"| {g['predicted_us'] / s['predicted_us']:.2f}x | {r['wall_s']} "
            f"| {r['rss_bytes'] / 2**30:.2f} GiB |"
        )
    return "\n".join(lines)


def shares_table(rows) -> str:
    head = (
        "| model | device | kernels | predicted us | launch | memory-bound | compute-bound "
        "| latency-bound |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in rows:
        b = r["breakdown"]
        lines.append(
            f"| {name} | {r['device']} | {r['summary']['kernels']} "
            f"| {r['summary']['predicted_us']:.1f} | {b['launch_share']:.0%} "
            f"| {b['memory_share']:.0%} | {b['compute_share']:.0%} | {b['latency_share']:.0%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
