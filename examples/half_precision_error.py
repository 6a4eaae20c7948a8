"""The error of ``--dtype fp16`` next to torch autocast's, per tiny example.

    python -m examples.half_precision_error [NAME ...] [--trials 3]

For each example (default: all), exported by TorchScript at opset 17 into a
temporary folder: the worst relative error (``max|got - want| / max|want|``,
verify.py's figure) of ``orchestrate.optimize(..., dtype="fp16")`` against
onnxruntime in fp32 over ``--trials`` seeds, and that of
``torch.autocast("cpu", dtype=torch.float16)`` against torch in fp32 on
seed 0's inputs.  The README's "Half precision" table is this output.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import orchestrate
from examples import EXAMPLES, build_model, export_example, random_inputs


def autocast_error(name: str) -> float:
    model, inputs = build_model(name, "tiny", 0)
    feeds = random_inputs(inputs, 0)
    args = [torch.from_numpy(feeds[i.name]) for i in inputs]
    with torch.no_grad():
        full = model(*args)
        with torch.autocast("cpu", dtype=torch.float16):
            half = model(*args)
    full = full if isinstance(full, (tuple, list)) else (full,)
    half = half if isinstance(half, (tuple, list)) else (half,)
    return max(float((h.float() - f).abs().max() / f.abs().max()) for h, f in zip(half, full))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    print(f"{'example':<16}{'orchestrate fp16':>18}{'autocast fp16':>15}{'kernels':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names:
            src = Path(tmp) / f"{name}.onnx"
            export_example(name, src, dynamo=False, opset=17, size="tiny")
            result = orchestrate.optimize(src, Path(tmp) / f"{name}.orch", dtype="fp16",
                                          device="h200", trials=args.trials)  # fmt: skip
            ours = max(c.rel for c in result.report.checks)
            print(f"{name:<16}{ours:>18.2e}{autocast_error(name):>15.2e}"
                  f"{result.plan.summary.kernels:>9}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
