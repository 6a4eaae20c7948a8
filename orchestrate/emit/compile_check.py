"""Compile every kernel of a bundle for an NVIDIA GPU, without a GPU.

    python -m orchestrate.emit.compile_check OUT [--arch 90]

The Triton interpreter runs kernels but does not type-check them the way the
compiler does (loop-carried types, constexpr use, dot shapes).  This runs
each launcher against stand-in tensors to learn its arguments, then hands the
kernel to ``triton.compile`` for ``cuda:<arch>`` all the way to a cubin
(Triton wheels ship ptxas).  Needs only triton and numpy, so it can check the
generated source against another Triton version in a separate environment.
Must run in a process where TRITON_INTERPRET is not set.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
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
    dtypes.update({i["name"]: i["dtype"] for i in plan["graph"]["input_types"]})
    manifest = json.loads((folder / "manifest.json").read_text())
    with np.load(folder / "weights.npz", allow_pickle=False) as z:
        for name, key in manifest.get("constants", {}).items():
            dtypes[name] = z[key].dtype.name
    return dtypes


def compile_bundle(folder: Path, arch: int = 90) -> list[str]:
    """Compile each kernel; return their names.  Raises on the first failure."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter does not compile")
    dtypes = tensor_dtypes(folder)
    spec = importlib.util.spec_from_file_location(f"compile_check_{abs(hash(folder))}",
                                                  folder / "kernels.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = {name: _Tensor(name, dtype) for name, dtype in dtypes.items()}
    compiled = []
    for kname, launcher in module.LAUNCHERS.items():
        kernel = getattr(module, kname)
        recorder = _Recorder()
        setattr(module, kname, recorder)
        try:
            launcher(env, interpret=False)
        finally:
            setattr(module, kname, kernel)
        ((args, kwargs),) = recorder.calls
        names = kernel.arg_names
        signature = {names[i]: POINTER[a.dtype] for i, a in enumerate(args)}
        signature.update({k: "constexpr" for k in kwargs})
        constexprs = {(names.index(k),): v for k, v in kwargs.items()}
        triton.compile(ASTSource(kernel, signature, constexprs=constexprs),
                       target=GPUTarget("cuda", arch, 32))  # fmt: skip
        compiled.append(kname)
    return compiled


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrate.emit.compile_check")
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: Hopper)")
    args = p.parse_args(argv)
    import triton

    failed = 0
    for folder in args.bundles:
        try:
            names = compile_bundle(folder, args.arch)
            print(f"{folder}: {len(names)} kernels compile for sm_{args.arch} "
                  f"(triton {triton.__version__})")  # fmt: skip
        except Exception as e:  # noqa: BLE001 - report every bundle
            failed += 1
            print(f"{folder}: FAILED: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
