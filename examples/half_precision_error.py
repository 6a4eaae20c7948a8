"""The error of ``--dtype fp16`` or ``bf16`` next to torch autocast's, per tiny example.

    python -m examples.half_precision_error [NAME ...] [--trials 3] [--dtype bf16]

For each example (default: all), exported by TorchScript at opset 17 into a
temporary folder: the worst relative error (``max|got - want| / max|want|``,
verify.py's figure) of ``orchestrate.optimize(..., dtype=DTYPE)`` against
onnxruntime in fp32 over ``--trials`` seeds, and that of
``torch.autocast("cpu", dtype=...)`` against torch in fp32 on seed 0's
inputs.  The README's "Half precision" tables are this output.  Without a
GPU a bf16 bundle's matmul kernels cannot run (Triton's interpreter has no
bf16 ``tl.dot``): its figure is then the plan simulated in numpy (the
``simulated`` column says so).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import orchestrate
from examples import EXAMPLES, build_model, export_example, random_inputs


def autocast_error(name: str, dtype: torch.dtype) -> float:
    model, inputs = build_model(name, "tiny", 0)
    feeds = random_inputs(inputs, 0)
    args = [torch.from_numpy(feeds[i.name]) for i in inputs]
    with torch.no_grad():
        full = model(*args)
        with torch.autocast("cpu", dtype=dtype):
            half = model(*args)
    full = full if isinstance(full, (tuple, list)) else (full,)
    half = half if isinstance(half, (tuple, list)) else (half,)
    return max(float((h.float() - f).abs().max() / f.abs().max()) for h, f in zip(half, full))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    args = parser.parse_args()
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    print(
        f"{'example':<16}{'orchestrate ' + args.dtype:>18}{'autocast ' + args.dtype:>15}"
        f"{'kernels':>9}{'simulated':>11}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names:
            src = Path(tmp) / f"{name}.onnx"
            export_example(name, src, dynamo=False, opset=17, size="tiny")
            result = orchestrate.optimize(
                src, Path(tmp) / f"{name}.orch", dtype=args.dtype, device="h200", trials=args.trials
            )
            ours = max(c.rel for c in result.report.checks)
            simulated = "yes" if result.report.simulated else "no"
            print(
                f"{name:<16}{ours:>18.2e}{autocast_error(name, half):>15.2e}"
                f"{result.plan.summary.kernels:>9}{simulated:>11}",
                flush=True,
            )


if __name__ == "__main__":
    main()
