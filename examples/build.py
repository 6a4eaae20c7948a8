"""Write the example models as ONNX files.

    python -m examples.build --out DIR [--only NAME ...] [--size tiny|base]
                             [--dynamo] [--opset N] [--dynamic] [--seed N]

Each example is written to ``DIR/<size>_<name>.onnx`` (TorchScript exporter,
opset 17, static shapes unless told otherwise) and one line per file says
what was written.  ``examples/models/tiny_bert.onnx``, the model ``make demo``
uses, is ``python -m examples.build --out examples/models --only bert``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from examples import EXAMPLES, ExportError, export_example

DEFAULT_OPSET = 17


def build_all(
    out: Path,
    names: list[str],
    size: str = "tiny",
    *,
    dynamo: bool = False,
    opset: int = DEFAULT_OPSET,
    dynamic: bool = False,
    seed: int = 0,
) -> list[Path]:
    """Export each example in ``names``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    return [
        write_example(out, name, size, dynamo=dynamo, opset=opset, dynamic=dynamic, seed=seed)
        for name in names
    ]


def write_example(
    out: Path,
    name: str,
    size: str,
    *,
    dynamo: bool = False,
    opset: int = DEFAULT_OPSET,
    dynamic: bool = False,
    seed: int = 0,
) -> Path:
    """Export example ``name`` at ``size`` to ``out/<size>_<name>.onnx`` and
    print one line saying what was written."""
    path = out / f"{size}_{name}.onnx"
    model, inputs = export_example(
        name, path, dynamo=dynamo, opset=opset, size=size, dynamic=dynamic, seed=seed
    )
    ops = Counter(n.op_type for n in model.graph.node)
    shapes = ", ".join(f"{i.name}{list(i.shape)}:{i.dtype}" for i in inputs)
    print(
        f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB, opset {opset}, "
        f"{len(model.graph.node)} nodes, {len(ops)} op types; inputs {shapes})",
        flush=True,
    )
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.build", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder to write the .onnx files to")
    p.add_argument(
        "--only",
        nargs="+",
        choices=sorted(EXAMPLES),
        metavar="NAME",
        help=f"examples to write (default all: {', '.join(EXAMPLES)})",
    )
    p.add_argument("--size", default="tiny", choices=("tiny", "base"))
    p.add_argument("--dynamo", action="store_true", help="use the torch.export-based exporter")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    p.add_argument("--dynamic", action="store_true", help="dynamic batch / sequence axes")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        build_all(
            args.out,
            args.only or list(EXAMPLES),
            args.size,
            dynamo=args.dynamo,
            opset=args.opset,
            dynamic=args.dynamic,
            seed=args.seed,
        )
    except ExportError as e:
        print(f"examples.build: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
