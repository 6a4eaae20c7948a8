"""One KernelBench program exported at its published size, in its own process.

``export(source, out)`` runs the program (``Model(*get_init_inputs())`` on
``get_inputs()``, full size, seed 0), exports it with the TorchScript exporter
(``torch.onnx.export(..., dynamo=False, opset_version=17)``, as
examples/kernelbench.py does at capped sizes) and saves it *shape-only*: every
tensor of more than ``KEEP`` elements loses its values, so a cached export is
a few kB whatever the weights weigh.  ``run(...)`` does that in a fresh
``python -m tools.measurements.export`` with a memory and a time limit and
says what became of it; the child's one-line error is its reason.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

KEEP = 64  # the most elements a stored tensor keeps its values for
VERSION = 1  # of what ``export`` writes: a cached export of another version is redone
DATA_FIELDS = (
    "raw_data",
    "float_data",
    "int32_data",
    "int64_data",
    "double_data",
    "uint64_data",
    "string_data",
    "external_data",
)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str = ""  # why not, one line
    limit: str = ""  # "time" or "memory" when a limit stopped it (a larger one may not)
    seconds: float = 0.0


def strip(model) -> None:
    """Drop the values of ``model``'s tensors (initializers, Constant values)
    of more than ``KEEP`` elements, in place: their dims and type stay."""
    import math

    from onnx import TensorProto

    def bare(t) -> None:
        if math.prod(t.dims) > KEEP:
            for field in DATA_FIELDS:
                t.ClearField(field)
            t.data_location = TensorProto.DEFAULT

    for t in model.graph.initializer:
        bare(t)
    for node in model.graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                bare(a.t)


def _draws(torch) -> None:
    """``torch.rand_mix`` and ``torch.rand_mix_like``: KernelBench's problems of
    mid-2025 draw their inputs with them, functions KernelBench's own utils
    attach to torch.  An export needs only the shape: here they draw uniformly."""

    def rand_mix(*size, dist="random", device=None, dtype=None, requires_grad=False):
        shape = size[0] if len(size) == 1 and isinstance(size[0], tuple | torch.Size) else size
        return torch.rand(shape, dtype=dtype, device=device, requires_grad=requires_grad)

    def rand_mix_like(tensor, dist="random", **kwargs):
        return rand_mix(*tensor.shape, dist=dist, **kwargs)

    for f in (rand_mix, rand_mix_like):
        if not hasattr(torch, f.__name__):
            setattr(torch, f.__name__, f)


def export(source: str, out: Path) -> None:
    """Run the program in ``source`` (in the module's default, training, mode:
    KernelBench times it so) and write its shape-only ONNX to ``out``."""
    import onnx
    import torch

    from examples import kernelbench  # (torch: in the exporting process only)

    namespace = kernelbench.program(source)  # a program of the mirror read
    _draws(torch)  # before get_inputs, the first to call them
    torch.manual_seed(0)
    with torch.no_grad():
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = kernelbench.program_inputs(namespace)
        names = [f"input{i}" for i in range(len(inputs))]
        with tempfile.TemporaryDirectory(prefix="kb-export-") as tmp:
            full = Path(tmp) / "model.onnx"  # weights over 2 GB go to files beside it
            torch.onnx.export(
                model,
                tuple(inputs),
                str(full),
                dynamo=False,
                opset_version=17,
                input_names=names,
                training=torch.onnx.TrainingMode.PRESERVE,
            )
            del model, inputs
            exported = onnx.load(str(full), load_external_data=False)
    strip(exported)
    onnx.save(exported, str(out))


def _one_line(e: BaseException) -> str:
    lines = f"{type(e).__name__}: {e}".strip().splitlines()
    return lines[0][:240] if lines else type(e).__name__


def run(source: str, out: Path, seconds: float, memory_gb: float, threads: int) -> Outcome:
    """``export`` in a child process of at most ``memory_gb`` of address space
    and ``seconds`` of wall time, with ``threads`` CPU threads."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    limit = int(memory_gb * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kb-") as tmp:
        src, result = Path(tmp) / "program.py", Path(tmp) / "result.json"
        src.write_text(source)
        cmd = [sys.executable, "-m", "tools.measurements.export", str(src), str(out), str(result)]
        root = Path(__file__).resolve().parents[2]
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            preexec_fn=cap,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _, err = proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return Outcome(False, f"no export in {seconds:.0f} s", "time", seconds)
        took = round(time.monotonic() - started, 1)
        if result.is_file():
            found = json.loads(result.read_text())
            if found["ok"]:
                return Outcome(True, seconds=took)
            memory = any(s in found["reason"] for s in ("MemoryError", "can't allocate memory"))
            return Outcome(False, found["reason"], "memory" if memory else "", took)
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        died = f"the process died (exit {proc.returncode}) {tail[0][:200]}".strip()
        return Outcome(False, died, "memory", took)


def main(argv: list[str]) -> int:
    src, out, result = (Path(a) for a in argv)
    sys.stdout = sys.stderr  # torch prints a failed export's graph
    try:
        export(src.read_text(), out)
        found = {"ok": True}
    except BaseException as e:  # noqa: BLE001  (any failure is the program's reason)
        found = {"ok": False, "reason": _one_line(e)}
    result.write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
