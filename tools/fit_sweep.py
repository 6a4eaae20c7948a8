"""`make fit-check`: every example and Hugging Face architecture, planned for
a GPU and compiled for it, each kernel checked against the device's limits.

    python -m tools.fit_sweep [--device h200] [--sizes tiny base]
                                 [--dtypes fp32 fp16] [--models NAME ...]
                                 [--no-hf] [--out out/fit]

For each model (the examples of ``examples/`` at each size, and the
``make hf-check`` architectures, TorchScript exporter, or torch.export where
TorchScript cannot export them) and each dtype, it runs
``orchestrate optimize --device DEVICE --dtype DTYPE --trials 0`` (numbers
are verified elsewhere: ``make test``, ``make hf-check``), then
``python -m orchestrate.check.compile_check --json`` on the bundle, which
compiles every jitted function for the device's architecture with Triton's
own compiler and ptxas (no GPU needed).  One table row per bundle: kernels,
distinct functions, the most shared memory and registers of any function,
the bytes spilled in all, and whether every kernel is within the device's
limits.  The JSON of every compile goes to ``OUT/fit.json``.  Exit status 1
if any bundle fails to build or any kernel is over a limit; spills are
reported but, as in ``compile_check``, do not fail.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def export_examples(names: list[str], sizes: list[str], out: Path) -> list[tuple[str, Path]]:
    from examples import ExportError, export_example

    done = []
    for size in sizes:
        for name in names:
            path = out / "models" / f"{size}_{name}.onnx"
            if not path.exists():
                print(f"exporting {size} {name} ...", file=sys.stderr, flush=True)
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    export_example(name, path, dynamo=False, opset=17, size=size)
                except ExportError as e:
                    print(f"  torch cannot export {name}: {e}", file=sys.stderr)
                    continue
            done.append((f"{size} {name}", path))
    return done


def export_hf(names: list[str] | None, out: Path) -> list[tuple[str, Path]]:
    import torch

    try:
        import transformers
    except ImportError:
        print(
            "fit_sweep: transformers is not installed (make hf-check installs it); "
            "skipping the Hugging Face architectures",
            file=sys.stderr,
        )
        return []
    from examples.export import export
    from examples.hf_models import LastHidden, _architectures, _example

    done = []
    for name, (build, kind) in _architectures(transformers).items():
        if names and name not in names:
            continue
        path = out / "models" / f"hf_{name}.onnx"
        if not path.exists():
            print(f"exporting hf {name} ...", file=sys.stderr, flush=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.manual_seed(0)
            if not _export_either(LastHidden(build().eval()), _example(kind), path, export):
                continue
        done.append((f"hf {name}", path))
    return done


def _export_either(model, example, path: Path, export) -> bool:
    """TorchScript at opset 17, else torch.export at 18 (grouped-query SDPA
    has no TorchScript conversion); False if neither can export it."""
    import torch

    from examples.export import ExportError

    for dynamo, opset in ((False, 17), (True, 18)):
        try:
            with torch.no_grad():
                export(
                    model,
                    [example],
                    path,
                    dynamo=dynamo,
                    opset=opset,
                    input_names=["x"],
                    output_names=["y"],
                )
            return True
        except ExportError as e:
            reason = str(e).splitlines()[0][:120]
            print(f"  {'dynamo' if dynamo else 'torchscript'}: {reason}", file=sys.stderr)
    return False


def check(
    label: str, src: Path, dtype: str, device: str, out: Path
) -> tuple[list[str], list, bool]:
    """One table row, the compile records, and whether the bundle passed."""
    bundle = out / "bundles" / f"{src.stem}_{dtype}.orch"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrate.cli",
            "optimize",
            str(src),
            "-o",
            str(bundle),
            "--device",
            device,
            "--dtype",
            dtype,
            "--trials",
            "0",
            "--reproducible",
        ],
        capture_output=True,
        text=True,
    )
    if made.returncode:
        reason = (made.stderr.strip().splitlines() or ["?"])[-1][:90]
        return [label, dtype, "-", "-", "-", "-", "-", f"FAILED to optimize: {reason}"], [], False
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    compiled = subprocess.run(
        [sys.executable, "-m", "orchestrate.check.compile_check", str(bundle), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    try:
        records = json.loads(compiled.stdout)
    except json.JSONDecodeError:
        reason = (compiled.stderr.strip().splitlines() or ["?"])[-1][:90]
        return [label, dtype, "-", "-", "-", "-", "-", f"FAILED to compile: {reason}"], [], False
    plan = json.loads((bundle / "plan.json").read_text())
    kernels = sum(1 for k in plan["kernels"] if k.get("template") != "view")
    within = all(r["within_limits"] for r in records)
    spill = sum(r["spill_bytes"] or 0 for r in records)
    for r in records:
        r.update(model=label, dtype=dtype)
    row = [
        label,
        dtype,
        str(kernels),
        str(len(records)),
        f"{max((r['shared_bytes'] for r in records), default=0):,}",
        str(max((r["registers"] or 0 for r in records), default=0)),
        f"{spill:,}",
        (
            "within limits"
            if within
            else "OVER: " + "; ".join(v for r in records for v in r["violations"])
        )
        + f" ({time.perf_counter() - started:.0f} s)",
    ]
    return row, records, within


def main(argv: list[str] | None = None) -> int:
    from examples import EXAMPLES

    p = argparse.ArgumentParser(
        prog="python -m tools.fit_sweep", description=__doc__.splitlines()[0]
    )
    p.add_argument("--device", default="h200")
    p.add_argument("--sizes", nargs="+", default=["tiny"], choices=("tiny", "base"))
    p.add_argument("--dtypes", nargs="+", default=["fp32", "fp16"])
    p.add_argument("--models", nargs="+", help="a subset (example or hf architecture names)")
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face architectures")
    p.add_argument("--out", type=Path, default=Path("out/fit"))
    args = p.parse_args(argv)
    names = [n for n in EXAMPLES if not args.models or n in args.models]
    models = export_examples(names, args.sizes, args.out)
    if not args.no_hf:
        models += export_hf(args.models, args.out)
    head = [
        "model",
        "dtype",
        "kernels",
        "functions",
        "max shared B",
        "max registers",
        "spilled B",
        "result",
    ]
    print(f"{args.device}: every kernel compiled for its architecture (Triton + ptxas, no GPU)\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)
    ok, everything = True, []
    for label, src in models:
        for dtype in args.dtypes:
            print(f"{label} {dtype} ...", file=sys.stderr, flush=True)
            row, records, passed = check(label, src, dtype, args.device, args.out)
            ok &= passed
            everything += records
            print("| " + " | ".join(row) + " |", flush=True)
    (args.out / "fit.json").write_text(json.dumps(everything, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
