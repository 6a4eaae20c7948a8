"""`make dynamic-check`: the examples exported with dynamic axes, one bundle for a range.

    python -m examples.ranges [--only NAME ...] [--exporters torchscript,dynamo]
                               [--range 1..8x2..64] [--trials N] [--random N]
                               [--out out/dynamic] [--device h100]

Each tiny transformer example and one CNN is exported by each torch exporter
with symbolic ``batch`` / ``sequence`` axes (image inputs: ``batch`` only),
then

1. optimized once for the range (``orchestrate.optimize(shapes=...)``: every
   dynamic axis takes its range from ``--range BATCHxSEQUENCE``, each
   ``MIN..MAX[@OPT]``, OPT defaulting to MAX; fixed axes keep their size);
2. loaded, and run at MIN, MAX and ``--random`` seeded shapes between that
   are not multiples of 16, each compared with onnxruntime running the
   exported model (relative error max|got - want| / max|want|, within 1e-4):
   a check of its own, apart from the verification ``optimize`` does;
3. priced at OPT against a static plan of the same model at the OPT shape
   (the cost model's predicted microseconds, and their ratio).

One line per model and exporter, then a table (also written to
OUT/dynamic.md).  A model torch cannot export with dynamic axes is skipped
with the reason, not counted as a failure of orchestrate's.  Exit status 1 if
any bundle fails to build or to match onnxruntime, or any ratio is over 1.10.

In the Triton interpreter (no GPU) every kernel launch is slow: the default
range takes tens of minutes on two cores; ``--range 1..2x2..9`` is a quick run.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # the dynamo exporter imports triton; without a GPU it must come up in
    # interpreter mode, which is fixed at its first import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import orchestrate  # noqa: E402
from examples import EXAMPLES, export_example  # noqa: E402
from examples.export import ExportError, Input, random_inputs  # noqa: E402
from orchestrate.plan import pipeline  # noqa: E402
from orchestrate.plan.planner import PlanOptions  # noqa: E402

TRANSFORMERS = ("bert", "gpt2", "vit", "llama", "mistral", "t5", "torch_encoder")
CNN = "resnet"  # dynamic batch only
NAMES = (*TRANSFORMERS, CNN)
EXPORTERS = {"torchscript": (False, 17), "dynamo": (True, 18)}  # gpt2 needs 18 for dynamo
DEFAULT_RANGE = "1..8x2..64"
RTOL = 1e-4  # fp32
MAX_RATIO = 1.10  # dynamic plan's predicted time at OPT over the static plan's
AXES = ("batch", "sequence")  # the examples' dynamic axis names, in --range order


@dataclass(frozen=True)
class Span:
    """One dimension's range: MIN..MAX, tuned for OPT."""

    min: int
    max: int
    opt: int

    def __str__(self) -> str:
        if self.min == self.max:
            return str(self.min)
        return f"{self.min}..{self.max}" + ("" if self.opt == self.max else f"@{self.opt}")


def parse_range(text: str) -> dict[str, Span]:
    """``BATCHxSEQUENCE`` (each N or MIN..MAX[@OPT]) as axis name -> Span;
    a single part gives the batch only (then only image models have a range)."""
    parts = text.split("x")
    if not 1 <= len(parts) <= len(AXES):
        raise argparse.ArgumentTypeError(f"--range {text}: expected BATCHxSEQUENCE")
    out = {}
    for axis, part in zip(AXES, parts):
        m = re.fullmatch(r"(\d+)(?:\.\.(\d+))?(?:@(\d+))?", part)
        if not m or (m.group(3) and not m.group(2)):
            raise argparse.ArgumentTypeError(
                f"--range {text}: {axis} {part!r} is not N or MIN..MAX[@OPT]"
            )
        lo = int(m.group(1))
        hi = int(m.group(2) or lo)
        opt = int(m.group(3) or hi)
        if not 1 <= lo <= opt <= hi:
            raise argparse.ArgumentTypeError(f"--range {text}: {axis} needs 1 <= MIN <= OPT <= MAX")
        out[axis] = Span(lo, hi, opt)
    return out


@dataclass
class Row:
    name: str
    exporter: str
    range: str = ""
    kernels: int = 0
    dynamic_us: float = float("nan")
    static_us: float = float("nan")
    shapes: tuple[str, ...] = ()
    worst: float = float("nan")
    status: str = "FAIL"  # ok, FAIL or skip
    note: str = ""
    seconds: float = 0.0

    @property
    def ratio(self) -> float:
        return self.dynamic_us / self.static_us if self.static_us > 0 else float("nan")

    def line(self) -> str:
        if self.status == "skip":
            return f"{self.name:14s} {self.exporter:11s} skip: {self.note}"
        return (
            f"{self.name:14s} {self.exporter:11s} {self.range:22s} {self.kernels:3d} kernels  "
            f"OPT {self.dynamic_us:9.2f} us dynamic vs {self.static_us:9.2f} static "
            f"({self.ratio:.3f})  {len(self.shapes)} shapes  worst {self.worst:.1e}  "
            f"{self.status}{'  ' + self.note if self.note else ''}  [{self.seconds:.0f} s]"
        )


def dynamic_axes(model: onnx.ModelProto, inputs: tuple[Input, ...]) -> str | None:
    """None when every axis the example declares dynamic is symbolic in the
    exported file, else why not (an exporter may specialise an axis)."""
    graph_inputs = {i.name: i for i in model.graph.input}
    for i in inputs:
        if i.name not in graph_inputs:
            return f"the exported model has no input {i.name!r}"
        dims = graph_inputs[i.name].type.tensor_type.shape.dim
        for axis, _ in i.dynamic:
            if dims[axis].HasField("dim_value"):
                return f"the exporter fixed {i.name} axis {axis} to {dims[axis].dim_value}"
    return None


def declared(inputs: tuple[Input, ...], spans: dict[str, Span]) -> dict[str, str] | str:
    """The ``shapes`` ranges for optimize (each dynamic axis its range, the
    others their size), or why the range does not cover the example."""
    shapes = {}
    for i in inputs:
        if not i.dynamic:
            continue
        dims = [str(d) for d in i.shape]
        for axis, name in i.dynamic:
            if name not in spans:
                return f"{i.name} axis {axis} ({name}) has no range in --range"
            dims[axis] = str(spans[name])
        shapes[i.name] = "x".join(dims)
    return shapes


def bindings(spans: dict[str, Span], used: list[str], count: int, seed: int) -> list[dict]:
    """MIN, MAX, then ``count`` seeded random bindings of the ``used`` axes,
    none a multiple of 16 where the range allows, all distinct."""
    out = [{a: spans[a].min for a in used}, {a: spans[a].max for a in used}]
    rng = random.Random(seed)
    for _ in range(100 * count):
        if len(out) >= 2 + count:
            break
        b = {}
        for a in used:
            s = spans[a]
            choices = [v for v in range(s.min, s.max + 1) if v % 16] or [s.min]
            b[a] = rng.choice(choices)
        if b not in out:
            out.append(b)
    return [b for k, b in enumerate(out) if b not in out[:k]]


def shapes_at(inputs: tuple[Input, ...], binding: dict[str, int]) -> dict[str, tuple[int, ...]]:
    out = {}
    for i in inputs:
        shape = list(i.shape)
        for axis, name in i.dynamic:
            shape[axis] = binding[name]
        out[i.name] = tuple(shape)
    return out


def rel_error(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))
    return err / scale if scale > 0 else err


def check(name: str, exporter: str, spans: dict[str, Span], args) -> Row:
    """Export, optimize for the range, run at several shapes against
    onnxruntime, price at OPT against a static plan."""
    row = Row(name, exporter)
    start = time.perf_counter()
    dynamo, opset = EXPORTERS[exporter]
    folder = args.out / f"{name}-{exporter}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    path = folder / f"tiny_{name}.onnx"
    try:
        model, inputs = export_example(name, path, dynamo=dynamo, opset=opset, dynamic=True)
    except ExportError as e:
        row.status, row.note = "skip", f"export: {e}"
        return row
    except Exception as e:  # torch's own failures: not orchestrate's
        row.status, row.note = "skip", f"export: {type(e).__name__}: {str(e).splitlines()[0]}"
        return row
    why = dynamic_axes(model, inputs)
    shapes = declared(inputs, spans) if why is None else why
    if isinstance(shapes, str):
        row.status, row.note = "skip", shapes
        return row
    used = [a for a in AXES if any(n == a for i in inputs for _, n in i.dynamic)]
    row.range = "x".join(str(spans[a]) for a in used)
    try:
        result = orchestrate.optimize(
            path, folder / "bundle", shapes=shapes, trials=args.trials, device=args.device
        )
        row.kernels = result.plan.summary.kernels
        row.dynamic_us = result.plan.summary.predicted_us
        opt = shapes_at(inputs, {a: spans[a].opt for a in used})
        static = pipeline.plan_graph(
            pipeline.fission_model(model, opt, str(path)), PlanOptions(device=args.device)
        )
        row.static_us = static.plan.summary.predicted_us
        loaded = orchestrate.load(folder / "bundle")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs = [o.name for o in session.get_outputs()]
        worst, seen = 0.0, []
        for k, b in enumerate(bindings(spans, used, args.random, args.seed)):
            feeds = random_inputs(inputs, args.seed + k, shapes_at(inputs, b))
            want = dict(zip(outputs, session.run(outputs, feeds)))
            got = loaded.run(feeds)
            err = max(rel_error(got[o], want[o]) for o in outputs)
            worst = max(worst, err)
            seen.append("x".join(str(b[a]) for a in used))
            if not err <= RTOL:
                row.note += f"{seen[-1]}: rel error {err:.1e}; "
        row.shapes, row.worst = tuple(seen), worst
        bad_ratio = not row.ratio <= MAX_RATIO
        if bad_ratio:
            row.note += f"ratio {row.ratio:.3f} > {MAX_RATIO}; "
        row.status = "FAIL" if row.note else "ok"
        row.note = row.note.rstrip("; ")
    except Exception as e:  # a failure of ours: reported (traceback on stderr), not raised
        traceback.print_exc()
        row.status = "FAIL"
        row.note = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        row.seconds = time.perf_counter() - start
    return row


def table(rows: list[Row]) -> str:
    head = (
        "| model | exporter | range | kernels | OPT dynamic µs | OPT static µs | ratio "
        "| shapes checked | worst rel error | result | seconds |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        if r.status == "skip":
            lines.append(f"| {r.name} | {r.exporter} | | | | | | | | skip: {r.note} | |")
            continue
        result = r.status + (f": {r.note}" if r.note else "")
        lines.append(
            f"| {r.name} | {r.exporter} | {r.range} | {r.kernels} | {r.dynamic_us:.2f} "
            f"| {r.static_us:.2f} | {r.ratio:.3f} | {', '.join(r.shapes)} "
            f"| {r.worst:.1e} | {result} | {r.seconds:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m examples.ranges", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--only",
        nargs="+",
        choices=sorted(EXAMPLES),
        metavar="NAME",
        help=f"examples to check (default: {' '.join(NAMES)})",
    )
    p.add_argument(
        "--exporters", default="torchscript,dynamo", help="comma-separated: torchscript, dynamo"
    )
    p.add_argument(
        "--range",
        type=parse_range,
        default=parse_range(DEFAULT_RANGE),
        dest="spans",
        metavar="BATCHxSEQUENCE",
        help=f"each MIN..MAX[@OPT] (default {DEFAULT_RANGE})",
    )
    p.add_argument(
        "--trials",
        type=int,
        default=1,
        help="random shapes optimize verifies besides MIN, OPT, MAX (default 1)",
    )
    p.add_argument(
        "--random",
        type=int,
        default=3,
        help="random shapes this script checks besides MIN and MAX (default 3)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("out/dynamic"))
    p.add_argument("--device", default="h100", help="the device both plans are priced for")
    args = p.parse_args(argv)
    exporters = [e.strip() for e in args.exporters.split(",") if e.strip()]
    for e in exporters:
        if e not in EXPORTERS:
            p.error(f"--exporters: unknown exporter {e!r} (choose from {', '.join(EXPORTERS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = []
    for name in args.only or NAMES:
        for exporter in exporters:
            rows.append(check(name, exporter, args.spans, args))
            print(rows[-1].line(), flush=True)
    md = table(rows)
    (args.out / "dynamic.md").write_text(md)
    print()
    print(md, end="")
    failed = [r for r in rows if r.status == "FAIL"]
    print(
        f"\n{len(rows) - len(failed)} of {len(rows)} passed or skipped "
        f"({sum(r.status == 'skip' for r in rows)} skipped), {len(failed)} failed; "
        f"{time.perf_counter() - start:.0f} s; table in {args.out / 'dynamic.md'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
