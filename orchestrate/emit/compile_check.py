"""Compile every kernel of a bundle for an NVIDIA GPU, without a GPU.

    python -m orchestrate.emit.compile_check OUT [--arch 90]

The Triton interpreter runs kernels but does not type-check them the way the
compiler does (loop-carried types, constexpr use, dot shapes).  This runs
each distinct launcher against stand-in tensors to learn its arguments, then
hands its jitted function to ``triton.compile`` for ``cuda:<arch>`` with the
launch's ``num_warps`` and ``num_stages`` and 16-byte aligned pointers (as
the JIT specialises torch's allocations), all the way to a cubin (Triton
wheels ship ptxas).  ``metadata.shared`` is the shared memory per block.

``compile_module`` needs only triton and numpy, so it can check generated
source against another Triton version in a separate environment.
``compile_bundle``, like ``orchestrate.load``, compiles the source generated
again from the bundle's plan, never the bundle's own kernels.py.
Must run in a process where TRITON_INTERPRET is not set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

POINTER = {
    "float16": "*fp16", "float32": "*fp32", "float64": "*fp64", "int8": "*i8", "int16": "*i16",
    "int32": "*i32", "int64": "*i64", "uint8": "*u8", "uint16": "*u16", "uint32": "*u32",
    "uint64": "*u64", "bool": "*i1",
}  # fmt: skip


class _Tensor:
    def __init__(self, name: str, dtype: str):
        self.name, self.dtype = name, dtype


class _Recorder:
    def __init__(self):
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((args, kwargs))

        return launch


def tensor_dtypes(folder: Path) -> dict[str, str]:
    plan = json.loads((folder / "plan.json").read_text())
    dtypes = {p["name"]: p["dtype"] for p in plan["primitives"]}
    dtypes.update({i["name"]: i["dtype"] for i in plan["graph"]["input_types"]})  # plain JSON:
    # this module needs only triton and numpy, to run beside another Triton version
    manifest = json.loads((folder / "manifest.json").read_text())
    with np.load(folder / "weights.npz", allow_pickle=False) as z:
        for name, key in manifest.get("constants", {}).items():
            dtypes[name] = z[key].dtype.name
    from orchestrate.bounds import INDEX_ERROR  # numpy only

    dtypes[INDEX_ERROR] = "int32"  # the index error flag the runner binds
    return dtypes


@dataclass(frozen=True)
class Compiled:
    function: str
    shared: int  # bytes of shared memory per block
    num_warps: int
    num_stages: int


def compile_module(module, dtypes: dict[str, str], arch: int = 90) -> list[Compiled]:
    """Compile each distinct jitted function of a generated module (one
    launch per function, with the first planned kernel's tensors)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter does not compile")
    done: dict[str, Compiled] = {}
    for launcher, tensors in module.KERNELS.values():
        fname = launcher.__name__.removeprefix("launch_")
        if fname in done:
            continue
        kernel = getattr(module, fname)
        recorder = _Recorder()
        setattr(module, fname, recorder)
        try:
            launcher(*(_Tensor(t, dtypes[t]) for t in tensors), interpret=False)
        finally:
            setattr(module, fname, kernel)
        ((args, kwargs),) = recorder.calls
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        names = kernel.arg_names
        signature = {names[i]: POINTER[a.dtype] for i, a in enumerate(args)}
        signature.update({k: "constexpr" for k in kwargs})
        constexprs = {(names.index(k),): v for k, v in kwargs.items()}
        # the JIT specialises 16-byte aligned pointers (torch allocations are)
        aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(args))}
        source = ASTSource(kernel, signature, constexprs=constexprs, attrs=aligned)
        c = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
        done[fname] = Compiled(fname, int(c.metadata.shared), int(c.metadata.num_warps),
                               int(c.metadata.num_stages))  # fmt: skip
    return list(done.values())


def compile_bundle(folder: Path, arch: int = 90) -> list[Compiled]:
    """Compile each function of a bundle.  Raises on the first failure.

    Like ``orchestrate.load``, it compiles the source generated again from
    the bundle's plan, and refuses a bundle whose kernels.py is not that
    source: a bundle's own Python is never run."""
    from orchestrate import bundle, regenerate
    from orchestrate.runtime import load_kernels

    contents = bundle.read(folder)
    source = regenerate.regenerate(contents.plan, contents.constants,
                                   contents.manifest["model"]["file"], str(folder)).source  # fmt: skip
    if source != contents.kernels_py:
        raise ValueError(f"{folder}: kernels.py is not the source generated from plan.json")
    return compile_module(load_kernels(source, interpret=False), tensor_dtypes(folder), arch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrate.emit.compile_check")
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: Hopper)")
    args = p.parse_args(argv)
    import triton

    failed = 0
    for folder in args.bundles:
        try:
            compiled = compile_bundle(folder, args.arch)
            print(f"{folder}: {len(compiled)} functions compile for sm_{args.arch} "
                  f"(triton {triton.__version__})")  # fmt: skip
        except Exception as e:  # noqa: BLE001 - report every bundle
            failed += 1
            print(f"{folder}: FAILED: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
