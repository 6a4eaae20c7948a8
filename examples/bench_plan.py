"""`make bench-plan`: plan the benchmark models and print one table.

    python -m examples.bench_plan [--models bert gpt2 llama] [--cache out/bench]

Each model is exported once (torch.onnx.export with dynamo=True, opset 18,
"base" sizes: BERT-base seq 128, GPT-2 small seq 128, the 24-layer
Llama-style decoder) into the cache folder, then planned in a fresh process
so that its wall time and peak resident memory are its own.  Targets
(2 CPU cores): each plan under 60 s and 2 GiB, every partition optimal, the
ILP strictly below greedy on the transformers.
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
TARGET_SECONDS = 60.0
TARGET_RSS_GIB = 2.0


def export_cached(name: str, cache: Path) -> Path:
    from examples import export_example

    path = cache / f"base_{name}_dynamo18.onnx"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        print(f"exporting {name} (base, dynamo, opset 18) to {path} ...", file=sys.stderr)
        export_example(name, tmp, dynamo=True, opset=18, size="base")
        for extra in tmp.parent.glob(tmp.name + "*.data"):
            extra.unlink()
        tmp.rename(path)
    return path


def plan_one(path: Path) -> dict:
    """Run in a child process: plan ``path`` and report time, memory, plan summary."""
    from orchestrate import frontend, pipeline
    from orchestrate.decompose import fission
    from orchestrate.emit import function_key
    from orchestrate.planner import PlanOptions

    started = time.perf_counter()
    model = pipeline.load(path)
    nodes = len(model.graph.node)
    prepared = frontend.prepare(model, None, str(path))
    del model
    graph = fission(prepared, str(path), consume=True)
    del prepared
    plan = pipeline.plan_graph(graph, PlanOptions()).plan
    wall = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = plan.to_json()
    return {
        "nodes": nodes,
        "primitives": len(result["primitives"]),
        "functions": len(
            {function_key(k.hash, k.primitives, k.outputs) for k in plan.kernels if not k.is_view}
        ),  # fmt: skip
        "solver": result["solver"],
        "summary": result["summary"],
        "baselines": result["baselines"],
        "wall_s": round(wall, 1),
        "rss_bytes": rss,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m examples.bench_plan", description=__doc__.split("\n")[0]
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--cache", type=Path, default=Path("out/bench"))
    p.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(plan_one(args.one)))
        return 0
    rows = []
    for name in args.models:
        path = export_cached(name, args.cache)
        out = subprocess.run(
            [sys.executable, "-m", "examples.bench_plan", "--one", str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        rows.append((name, json.loads(out.stdout.strip().splitlines()[-1])))
    print(table(rows))
    failed = [r for r in rows if not meets_targets(r[1])]
    for name, r in failed:
        print(f"TARGET MISSED: {name}: {reasons(r)}", file=sys.stderr)
    return 1 if failed else 0


def meets_targets(r: dict) -> bool:
    return not reasons(r)


def reasons(r: dict) -> list[str]:
    out = []
    if r["wall_s"] >= TARGET_SECONDS:
        out.append(f"{r['wall_s']} s >= {TARGET_SECONDS} s")
    if r["rss_bytes"] >= TARGET_RSS_GIB * 2**30:
        out.append(f"peak RSS {r['rss_bytes'] / 2**30:.2f} GiB")
    if r["solver"]["status"] != "optimal":
        out.append(f"solver status {r['solver']['status']}")
    if r["summary"]["predicted_us"] >= r["baselines"]["greedy"]["predicted_us"]:
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


if __name__ == "__main__":
    sys.exit(main())
