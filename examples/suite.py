"""Write the benchmark suite: full-size models with random weights, no network.

    python -m examples.suite [--out DIR] [--tiny] [--only NAME ...]
                             [--dynamo] [--opset N] [--seed N]

The suite is the architectures a fusing compiler for inference should be
judged on: BERT-base (sequence 128), GPT-2 small, ViT-B/16, a Llama-style
decoder (four layers at width 2048, head dim 128, grouped-query attention,
RoPE, SwiGLU), ResNet-50, ConvNeXt-T, SegFormer-B0, a style-transfer network
(the model zoo's "candy"), and a YOLO-style PAN/FPN detector.  Each is written
to ``DIR/<size>_<name>.onnx`` (TorchScript exporter, opset 17, static
shapes), one line per file; ``--tiny`` writes the tiny variant of each
instead, small enough for CPU runs of optimize + verify.

The default folder, ``out/models``, is under ``out/``, which git ignores and
``make clean`` removes: the full-size files are about 3 GB of random weights
that any checkout rebuilds in a few minutes, so they are never committed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from examples import ExportError
from examples.build import DEFAULT_OPSET, write_example

# (example, size of the full-size model); --tiny takes "tiny" for each
SUITE = (
    ("bert", "base"),
    ("gpt2", "base"),
    ("vit", "base"),
    ("llama", "wide"),
    ("resnet50", "base"),
    ("convnext", "base"),
    ("segformer", "base"),
    ("style_transfer", "base"),
    ("yolo", "base"),
)
DEFAULT_OUT = Path("out/models")


def main(argv: list[str] | None = None) -> int:
    names = [name for name, _ in SUITE]
    p = argparse.ArgumentParser(prog="python -m examples.suite", description=__doc__.split("\n")[0])
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder to write the .onnx files to (default {DEFAULT_OUT})",
    )
    p.add_argument("--tiny", action="store_true", help="the tiny variant of each model")
    p.add_argument(
        "--only",
        nargs="+",
        choices=names,
        metavar="NAME",
        help=f"models to write (default all: {', '.join(names)})",
    )
    p.add_argument("--dynamo", action="store_true", help="use the torch.export-based exporter")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for name, size in SUITE:
            if args.only is None or name in args.only:
                write_example(
                    args.out,
                    name,
                    "tiny" if args.tiny else size,
                    dynamo=args.dynamo,
                    opset=args.opset,
                    seed=args.seed,
                )
    except ExportError as e:
        print(f"examples.suite: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
