"""A peer's test suite through orchestrate: KernelBench's PyTorch programs.

KernelBench (ScalingIntelligence/KernelBench, MIT) holds PyTorch programs by
level: single operators (level 1), fused sequences (level 2), whole models
(level 3).  Each file defines ``Model``, ``get_inputs`` and
``get_init_inputs`` beside module-level sizes.  This script, run on a local
checkout of that repository (this project ships none of its files):

1. shrinks each program: every integer size at module level above
   ``--cap`` becomes ``--cap``, and the module runs again, so sizes derived
   from them follow (the Triton interpreter then runs it in seconds);
2. exports the model with its inputs to ONNX (``torch.onnx.export``,
   TorchScript exporter, opset 17);
3. runs ``orchestrate.optimize`` on it (``--trials`` random inputs, the
   bundle verified against the float64 reference and onnxruntime),

each program in its own process with a time limit, and prints what became
of them: verified, declined by op (``UnsupportedError``: an op, attribute or
dtype without a decomposition), refused (``InputError``: the model as
exported breaks a stated limit), wrong (verification failed), crashed (any
other exception), timed out, and not exported (the program does not shrink
or torch cannot export it).

    python -m examples.kernelbench PATH/TO/KernelBench --levels 1,2
    make peer-check KERNELBENCH=PATH/TO/KernelBench
"""

from __future__ import annotations

import argparse
import ast
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

OUTCOMES = (
    "verified",
    "declined",
    "refused",
    "wrong",
    "crashed",
    "timed out",
    "not exported",
)


@dataclass(frozen=True)
class Outcome:
    program: str  # level/file name
    outcome: str  # one of OUTCOMES
    detail: str  # the reason, one line
    ops: tuple[str, ...] = ()  # declined: the op types or items refused
    seconds: float = 0.0


def shrunk_source(source: str, cap: int) -> str:
    """``source`` with each module-level integer literal above ``cap`` in an
    assignment (``dim = 16384``, ``height = width = 128``, ``shape = (4096,
    512)``) replaced by ``cap``."""
    tree = ast.parse(source)

    class Cap(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant):
            if type(node.value) is int and node.value > cap:
                return ast.copy_location(ast.Constant(cap), node)
            return node

    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            Cap().visit(stmt)
    return ast.unparse(tree)


def program(source: str) -> dict:
    """A KernelBench program's names (``Model``, ``get_inputs``,
    ``get_init_inputs``): its source run, from a checkout the user named."""
    namespace: dict = {"__name__": "kernelbench_program"}
    exec(compile(source, "<kernelbench>", "exec"), namespace)  # noqa: S102
    return namespace


def program_inputs(namespace: dict) -> list:
    """The program's ``get_inputs()`` as tensors: a number among them (a
    scale, say) becomes a 0-d tensor input; anything else is a ValueError."""
    import torch

    inputs = [
        torch.tensor(x) if isinstance(x, int | float) and not isinstance(x, bool) else x
        for x in namespace["get_inputs"]()
    ]
    if not all(isinstance(x, torch.Tensor) for x in inputs):
        raise ValueError("an input is neither a tensor nor a number")
    return inputs


def _export(source: str, path: Path, seed: int) -> list[str]:
    """Run the shrunk program and export its model to ``path``; the input names."""
    import torch

    namespace = program(source)
    torch.manual_seed(seed)
    model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
    inputs = program_inputs(namespace)
    names = [f"input{i}" for i in range(len(inputs))]
    with torch.no_grad():
        torch.onnx.export(
            model, tuple(inputs), str(path), dynamo=False, opset_version=17, input_names=names
        )
    return names


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()
    return text[0][:300] if text else type(e).__name__


def run_program(file: str, label: str, cap: int, trials: int, time_limit: float) -> Outcome:
    """Shrink, export and optimize one program (in the calling process)."""
    import orchestrate
    from orchestrate.api import VerificationError
    from orchestrate.errors import InputError, UnsupportedError

    started = time.perf_counter()

    def done(outcome: str, detail: str, ops=()) -> Outcome:
        return Outcome(label, outcome, detail, tuple(ops), round(time.perf_counter() - started, 1))

    with tempfile.TemporaryDirectory(prefix="kernelbench-") as tmp:
        src = Path(tmp) / "model.onnx"
        try:
            _export(shrunk_source(Path(file).read_text(), cap), src, seed=0)
        except Exception as e:  # noqa: BLE001  (a program that does not shrink or export)
            return done("not exported", _one_line(e))
        try:
            result = orchestrate.optimize(
                src, Path(tmp) / "out.orch", trials=trials, time_limit=time_limit
            )
        except VerificationError as e:
            return done("wrong", _one_line(e))
        except UnsupportedError as e:
            return done("declined", _one_line(e), sorted(e.items or {}))
        except InputError as e:
            return done("refused", _one_line(e))
        except Exception as e:  # noqa: BLE001
            detail = _one_line(e) + " | " + traceback.format_exc().strip().splitlines()[-3].strip()
            return done("crashed", detail)
        ok = result.report is None or result.report.ok
        return done("verified" if ok else "wrong", f"{len(result.plan.kernels)} kernels")


def _child(queue, args) -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.stdout = sys.stderr  # torch prints a failed export's graph: keep the summary clean
    try:
        queue.put(run_program(*args))
    except BaseException as e:  # noqa: BLE001  (this script's own failure: say so at once)
        queue.put(Outcome(args[1], "crashed", "examples/kernelbench.py: " + _one_line(e)))


def run_isolated(file: str, label: str, cap: int, trials: int, time_limit: float, timeout: float):
    """``run_program`` in a child process, killed after ``timeout`` seconds."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, (file, label, cap, trials, time_limit)))
    started = time.perf_counter()
    proc.start()
    try:
        outcome = queue.get(timeout=timeout)
    except Exception:  # noqa: BLE001  (queue.Empty: the child ran out of time or died)
        proc.kill()
        proc.join()
        seconds = round(time.perf_counter() - started, 1)
        if proc.exitcode not in (None, 0, -9):
            return Outcome(
                label, "crashed", f"the process died (exit {proc.exitcode})", (), seconds
            )
        return Outcome(label, "timed out", f"no result in {timeout:.0f} s", (), seconds)
    proc.join()
    return outcome


def programs(root: Path, levels: list[int]) -> list[tuple[str, str]]:
    """(path, level/name) of every program of ``levels``, in KernelBench's
    numbering order."""
    out = []
    for level in levels:
        folder = root / "KernelBench" / f"level{level}"
        if not folder.is_dir():
            folder = root / f"level{level}"
        if not folder.is_dir():
            raise SystemExit(f"kernelbench: {root} has no KernelBench/level{level} folder")

        def number(p: Path) -> tuple[int, str]:
            head = p.name.split("_", 1)[0]
            return (int(head) if head.isdigit() else 1 << 30, p.name)

        for p in sorted(folder.glob("*.py"), key=number):
            out.append((str(p), f"level{level}/{p.stem}"))
    return out


def summary(outcomes: list[Outcome]) -> list[str]:
    counts = Counter(o.outcome for o in outcomes)
    lines = [f"programs: {len(outcomes)}"]
    lines += [f"  {name:<13} {counts.get(name, 0):4d}" for name in OUTCOMES]
    ops = Counter(op for o in outcomes if o.outcome == "declined" for op in o.ops)
    if ops:
        lines.append("declined by op (programs):")
        lines += [f"  {n:4d}  {op}" for op, n in ops.most_common()]
    for kind in ("wrong", "crashed", "refused", "timed out"):
        bad = [o for o in outcomes if o.outcome == kind]
        if bad:
            lines.append(f"{kind}:")
            lines += [f"  {o.program}: {o.detail}" for o in bad]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.kernelbench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("root", type=Path, help="a checkout of ScalingIntelligence/KernelBench")
    parser.add_argument("--levels", default="1,2", help="comma-separated levels (default 1,2)")
    parser.add_argument("--cap", type=int, default=16, help="the largest size kept (default 16)")
    parser.add_argument("--trials", type=int, default=1, help="verification trials (default 1)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="planning seconds")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per program")
    parser.add_argument("--only", default="", help="programs whose name contains this")
    parser.add_argument("--json", type=Path, help="write every outcome here (JSON lines)")
    args = parser.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        print(
            f"kernelbench: --levels {args.levels!r}: expected numbers such as 1,2", file=sys.stderr
        )
        return 2
    if not args.root.is_dir():
        print(
            f"kernelbench: {args.root} is not a folder (a checkout of KernelBench)", file=sys.stderr
        )
        return 2
    todo = [(f, label) for f, label in programs(args.root, levels) if args.only in label]
    outcomes = []
    for i, (file, label) in enumerate(todo, 1):
        o = run_isolated(file, label, args.cap, args.trials, args.time_limit, args.timeout)
        outcomes.append(o)
        print(
            f"[{i}/{len(todo)}] {label}: {o.outcome} ({o.seconds} s) {o.detail}",
            file=sys.stderr,
            flush=True,
        )
    if args.json:
        args.json.write_text("".join(json.dumps(asdict(o)) + "\n" for o in outcomes))
    for line in summary(outcomes):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
