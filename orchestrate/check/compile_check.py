"""Compile every kernel of a bundle for its NVIDIA GPU, without a GPU, and
prove that each fits the device before anything launches.

    python -m orchestrate.check.compile_check OUT... [--arch 90] [--json]

The Triton interpreter runs kernels but does not type-check them the way the
compiler does (loop-carried types, constexpr use, dot shapes), nor say what
they need on chip.  This runs each distinct launcher against stand-in tensors
to learn its arguments, then hands its jitted function to ``triton.compile``
for ``cuda:<arch>`` with the launch's ``num_warps`` and ``num_stages`` and
16-byte aligned pointers (as the JIT specialises torch's allocations), all
the way to a cubin (Triton wheels ship ptxas and cuobjdump).  ``arch`` is the
bundle's device's (plan.json's ``device``, a row of ``orchestrate/cost/devices.py``:
90 for H100/H200, 80 for A100, 89 for L4/L40S/4090, ...); ``--arch``
overrides it, and the limits stay the device's.  Per function:

``shared_bytes``  ``metadata.shared``: shared memory per block, static and dynamic
``num_warps``, ``num_stages``  the compiled metadata
``registers``     per thread, ``REG`` of ``cuobjdump -res-usage`` on the cubin
``stack_bytes``   per thread, its ``STACK``
``spill_bytes``   bytes of the local-memory stores and loads (STL, LDL) in
                  ``cuobjdump -sass``: ptxas -v's spill stores + spill loads

A kernel exceeds the device, and the command exits 1 with one line per
limit, when its shared memory is over ``smem_per_block_kb``, its threads
over ``threads_per_block``, its registers over ``registers_per_thread`` or
registers x threads over ``registers_per_sm``.  Spills and stack are
printed but do not fail: the kernel launches and computes the same, only
slower, and the fit model's spill rule (``kernels/fit.py``) is what keeps
the planner away from them.  Without cuobjdump, one line says so and
registers, spills and stack are unknown (null in ``--json``, not checked).
``--json`` prints a list with one object per function of every bundle.

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
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from orchestrate.cost.devices import Device

POINTER = {
    "float16": "*fp16",
    "bfloat16": "*bf16",
    "float32": "*fp32",
    "float64": "*fp64",
    "int8": "*i8",
    "int16": "*i16",
    "int32": "*i32",
    "int64": "*i64",
    "uint8": "*u8",
    "uint16": "*u16",
    "uint32": "*u32",
    "uint64": "*u64",
    "bool": "*i1",
}


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
    for name in manifest.get("bfloat16", ()):  # stored as uint16 bit patterns
        dtypes[name] = "bfloat16"
    from orchestrate.ir.bounds import INDEX_ERROR  # numpy only

    dtypes[INDEX_ERROR] = "int32"  # the index error flag the runner binds
    from orchestrate.kernels.spec import SCRATCH_DTYPES

    dtypes.update(SCRATCH_DTYPES)  # a split-K matmul's workspace and counters
    return dtypes


@dataclass(frozen=True)
class Compiled:
    function: str
    shared: int  # bytes of shared memory per block (metadata.shared)
    num_warps: int
    num_stages: int
    # from the cubin (cuobjdump); None when there is no cuobjdump to ask
    registers: int | None = None  # per thread
    spill_bytes: int | None = None  # spill stores + spill loads, as ptxas -v counts them
    stack_bytes: int | None = None  # local-memory frame per thread


def cuobjdump_path() -> str | None:
    """The cuobjdump Triton ships (or TRITON_CUOBJDUMP_PATH names), else the one on PATH."""
    try:
        from triton import knobs

        return knobs.nvidia.cuobjdump.path
    except (ImportError, AttributeError, RuntimeError):  # older Triton, or not found
        return shutil.which("cuobjdump")


_RES_FUNCTION = re.compile(r"^\s*Function\s+(\S+?)\s*:\s*$")  # -res-usage: " Function relu:"
_SASS_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")  # -sass: "Function : relu"
_FIELD = re.compile(r"([A-Z_]+(?:\[\d+\])?):(\d+)")  # REG:22, CONSTANT[0]:568
# a local-memory store or load, predicated or not: "/*0060*/  @!P0 STL.64 [R1+0x8], R2 ;"
_LOCAL = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(?:STL|LDL)((?:\.\w+)*)\s")
_WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}  # no suffix: 32 bits


def resource_usage(text: str) -> dict[str, dict[str, int]]:
    """Each function's fields in ``cuobjdump -res-usage`` output (``REG``,
    ``STACK``, ``SHARED``, ``LOCAL``, ``CONSTANT[0]``, ...), by function name."""
    usage: dict[str, dict[str, int]] = {}
    fields = None
    for line in text.splitlines():
        if m := _RES_FUNCTION.match(line):
            fields = usage.setdefault(m.group(1), {})
        elif _SASS_FUNCTION.match(line) or not line.strip():
            fields = None
        elif fields is not None:
            fields.update((k, int(v)) for k, v in _FIELD.findall(line))
    return usage


def local_traffic(text: str) -> dict[str, int]:
    """Bytes of the local-memory stores and loads (STL, LDL) in each function
    of ``cuobjdump -sass`` output.  Triton kernels have no local arrays, so
    this is ptxas -v's "spill stores" + "spill loads" (equal on a kernel
    that spills 61,448 + 61,524 B)."""
    traffic: dict[str, int] = {}
    function = None
    for line in text.splitlines():
        if m := _SASS_FUNCTION.match(line):
            function = m.group(1)
            traffic.setdefault(function, 0)
        elif function is not None and (m := _LOCAL.match(line)):
            suffixes = m.group(1).split(".")
            traffic[function] += next((_WIDTH[s] for s in suffixes if s in _WIDTH), 4)
    return traffic


def cubin_usage(cubin: bytes, function: str, tool: str) -> tuple[int, int, int]:
    """(registers, spill bytes, stack bytes) of ``function`` in ``cubin``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{function}.cubin"
        path.write_bytes(cubin)
        run = subprocess.run(
            [tool, "-res-usage", "-sass", str(path)], capture_output=True, text=True, timeout=600
        )
    if run.returncode:
        raise RuntimeError(f"{tool} -res-usage failed on {function}: {run.stderr.strip()[:500]}")
    fields = resource_usage(run.stdout).get(function)
    if fields is None or "REG" not in fields:
        raise RuntimeError(f"{tool} -res-usage names no REG for function {function}")
    return fields["REG"], local_traffic(run.stdout).get(function, 0), fields.get("STACK", 0)


# -- the device's limits: pure functions of the figures and the device --------------------


def limit_violations(c: Compiled, device: Device) -> list[str]:
    """Each limit of ``device`` that ``c`` exceeds, as a sentence; none when
    it launches.  Registers unknown (no cuobjdump) are not checked."""
    reasons = []
    smem = device.smem_per_block_kb * 1024
    if c.shared > smem:
        reasons.append(f"shared memory {c.shared:,} B > {smem:,} B per block")
    threads = 32 * c.num_warps
    if threads > device.threads_per_block:
        reasons.append(f"{threads} threads > {device.threads_per_block} per block")
    if c.registers is not None:
        if c.registers > device.registers_per_thread:
            reasons.append(f"{c.registers} registers > {device.registers_per_thread} per thread")
        if c.registers * threads > device.registers_per_sm:
            reasons.append(
                f"{c.registers} registers x {threads} threads = "
                f"{c.registers * threads:,} > {device.registers_per_sm:,} per SM"
            )
    return reasons


def slowdowns(c: Compiled) -> list[str]:
    """Local-memory use: reported, not a failure (the kernel launches and is
    correct, only slower)."""
    notes = []
    if c.spill_bytes:
        notes.append(f"spills {c.spill_bytes:,} B of registers (stores + loads)")
    if c.stack_bytes:
        notes.append(f"{c.stack_bytes:,} B of stack per thread")
    return notes


def compile_module(
    module,
    dtypes: dict[str, str],
    arch: int = 90,
    usage: bool = True,
    dims: dict[str, int] | None = None,
    only: set[str] | None = None,
) -> list[Compiled]:
    """Compile each distinct jitted function of a generated module (one
    launch per function, with the first planned kernel's tensors).  Registers,
    spills and stack are None when there is no cuobjdump, or not asked for
    (``usage`` false: compiling ahead of a launch, ``tune/gpu.py``).
    ``dims``: a dynamic bundle's dimensions (code name -> a value), which
    its launchers take and its kernels receive as runtime ``i32``
    arguments: compiled unspecialized, so one cubin serves the range.
    ``only``: the names of the functions to compile (default: every one)."""
    dims = dict(dims or {})
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter does not compile")
    tool = cuobjdump_path() if usage else None
    done: dict[str, Compiled] = {}
    for launcher, tensors in module.KERNELS.values():
        fname = launcher.__name__.removeprefix("launch_")
        if fname in done or fname in library_launchers(module) or (only and fname not in only):
            continue
        kernel = getattr(module, fname)
        recorder = _Recorder()
        setattr(module, fname, recorder)
        try:
            launcher(*(_Tensor(t, dtypes[t]) for t in tensors), interpret=False, **dims)
        finally:
            setattr(module, fname, kernel)
        ((args, kwargs),) = recorder.calls
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        names = kernel.arg_names
        signature = {names[i]: POINTER[a.dtype] for i, a in enumerate(args)}
        runtime = {k for k in kwargs if k in dims}
        signature.update({k: "i32" if k in runtime else "constexpr" for k in kwargs})
        signature = {n: signature[n] for n in names if n in signature}  # argument order
        constexprs = {(names.index(k),): v for k, v in kwargs.items() if k not in runtime}
        # the JIT specialises 16-byte aligned pointers (torch allocations are)
        aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(args))}
        source = ASTSource(kernel, signature, constexprs=constexprs, attrs=aligned)
        c = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
        usage = cubin_usage(c.asm["cubin"], c.metadata.name, tool) if tool else (None,) * 3
        done[fname] = Compiled(
            fname,
            int(c.metadata.shared),
            int(c.metadata.num_warps),
            int(c.metadata.num_stages),
            *usage,
        )
    return list(done.values())


LIBRARY_SKIPPED = "a library launcher (a torch call): no Triton function to compile or fit"


def library_launchers(module) -> list[str]:
    """The functions of a generated module that are library calls
    (``templates/library/emit.py``: a plain launcher with no jitted function), which
    ``compile_module`` skips (``LIBRARY_SKIPPED``)."""
    found = []
    for launcher, _ in module.KERNELS.values():
        fname = launcher.__name__.removeprefix("launch_")
        if not hasattr(getattr(module, fname, None), "arg_names") and fname not in found:
            found.append(fname)
    return found


def library_kernels(folder: Path) -> list[str]:
    """The planned kernels of a bundle that are library calls."""
    from orchestrate.kernels.spec import LIBRARY  # numpy only

    kernels = json.loads((folder / "plan.json").read_text())["kernels"]
    return [k["name"] for k in kernels if k["template"] in LIBRARY]


def compile_bundle(folder: Path, arch: int | None = None) -> list[Compiled]:
    """Compile each function of a bundle for ``arch`` (default: its device's).
    Raises on the first failure.

    Like ``orchestrate.load``, it compiles the source generated again from
    the bundle's plan, and refuses a bundle whose kernels.py is not that
    source: a bundle's own Python is never run."""
    from orchestrate import bundle
    from orchestrate.bundle import regenerate
    from orchestrate.run.runtime import load_kernels

    contents = bundle.read(folder)
    dims = None
    if contents.dims is not None:  # a dynamic bundle: its kernels take the dimensions
        from orchestrate.plan.ranged import regenerate_ranged
        from orchestrate.shapes.family import Family

        family = Family.from_json(contents.dims, f"{folder}/{bundle.DIMS}")
        source = regenerate_ranged(
            contents.plan,
            family,
            contents.constants,
            contents.manifest["model"]["file"],
            str(folder),
        ).source
        dims = dict(zip(family.codes, family.at("max")))
    else:
        source = regenerate.regenerate(
            contents.plan, contents.constants, contents.manifest["model"]["file"], str(folder)
        ).source
    if source != contents.kernels_py:
        raise ValueError(f"{folder}: kernels.py is not the source generated from plan.json")
    arch = arch or bundle_device(folder).arch
    return compile_module(
        load_kernels(source, interpret=False), tensor_dtypes(folder), arch, dims=dims
    )


def bundle_device(folder: Path) -> Device:
    """The device the bundle was planned for (plan.json's ``device``)."""
    from orchestrate.cost.devices import get_device

    return get_device(json.loads((folder / "plan.json").read_text())["device"])


def report(folder: Path, c: Compiled, device: Device, arch: int) -> dict:
    """One kernel's line of ``--json``."""
    violations = limit_violations(c, device)
    return {
        "bundle": str(folder),
        "kernel": c.function,
        "device": device.name,
        "arch": arch,
        "shared_bytes": c.shared,
        "registers": c.registers,
        "spill_bytes": c.spill_bytes,
        "stack_bytes": c.stack_bytes,
        "num_warps": c.num_warps,
        "num_stages": c.num_stages,
        "within_limits": not violations,
        "violations": violations,
        "slowdowns": slowdowns(c),
    }


def _summary(folder: Path, compiled: list[Compiled], device: Device, arch: int) -> str:
    import triton

    regs = [c.registers for c in compiled if c.registers is not None]
    most = (
        (
            f", at most {max(c.shared for c in compiled):,} B shared"
            f" (of {device.smem_per_block_kb * 1024:,}) and "
            + (f"{max(regs)} registers" if regs else "registers unknown")
        )
        if compiled
        else ""
    )
    return (
        f"{folder}: {len(compiled)} functions compile for sm_{arch} "
        f"(triton {triton.__version__}, {device.name} limits){most}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrate.check.compile_check")
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument(
        "--arch",
        type=int,
        default=None,
        help="compute capability x10 to compile for (default: the bundle's device)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per kernel")
    args = p.parse_args(argv)

    if cuobjdump_path() is None:
        print(
            "cuobjdump not found (set TRITON_CUOBJDUMP_PATH): registers, spills and stack unknown",
            file=sys.stderr,
        )
    failed = 0
    rows = []
    for folder in args.bundles:
        try:
            device = bundle_device(folder)
            arch = args.arch or device.arch
            compiled = compile_bundle(folder, arch)
        except Exception as e:  # noqa: BLE001 - report every bundle
            failed += 1
            print(f"{folder}: FAILED: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
            continue
        if not args.json:
            print(_summary(folder, compiled, device, arch))
            library = library_kernels(folder)
            if library:
                print(
                    f"{folder}: {len(library)} kernels skipped ({', '.join(library[:3])}"
                    f"{', ...' if len(library) > 3 else ''}): {LIBRARY_SKIPPED}"
                )
        for c in compiled:
            row = report(folder, c, device, arch)
            rows.append(row)
            for reason in row["violations"]:
                failed += 1
                print(f"{folder}: {c.function}: exceeds {device.name}: {reason}", file=sys.stderr)
            for note in row["slowdowns"] if not args.json else ():
                print(f"{folder}: {c.function}: {note}")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
