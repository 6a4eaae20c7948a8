"""Assembling generated kernels into one readable Python module.

Each distinct kernel spec becomes one ``@triton.jit`` function with its
arguments grouped (pointers, then ``tl.constexpr`` meta-parameters) and a
launcher ``launch_<function>(in0, ..., out0, ..., interpret=False)`` that
takes torch tensors, picks the block sizes, builds the grid and launches
with the spec's ``num_warps`` and ``num_stages``.  In interpreter mode (no
GPU) the launchers pick larger blocks: the interpreter's cost grows with the
number of programs, not with the block size.

A library spec (``templates/library/emit.py``) prints a plain launcher with the same
signature that calls torch; the module then imports torch too.

Pointer arguments are named by position, not after tensors: ``in<j>`` for
the kernel's j-th input read from memory, ``out<j>`` for the j-th tensor it
writes.  So one function serves every planned kernel with the same spec (a
transformer's layers); the module's ``KERNELS`` table binds each planned
kernel to its launcher and its tensors.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import TL_DTYPE, Pointers
from orchestrate.emit.helpers import HELPERS, Helper
from orchestrate.ir import HALF, Graph
from orchestrate.ir.bounds import INDEX_ERROR
from orchestrate.kernels.spec import (
    SPLIT_K_COUNTERS,
    SPLIT_K_PARTIALS,
    KernelSpec,
    LaunchConfig,
    inlined,
    split_k,
)
from orchestrate.shapes.symint import SymInt
from orchestrate.text import comment, docstring, string

_NAME = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


class Function(Protocol):
    """What a module holds per distinct spec: a ``KernelSource`` (a jitted
    function and its launcher) or a library launcher (``templates/library/emit.py``,
    which imports this module, so it is named here by what it provides).
    ``render(dims)``: ``dims`` the code names of a range's dimensions, which
    the launcher takes as keywords."""

    helpers: list[Helper]

    def render(self, dims: Sequence[str] = ()) -> str: ...


def dims_in(lines: Sequence[str], dims: Sequence[str]) -> list[str]:
    """The dimensions (code names) that ``lines`` of source read, in order."""
    if not dims:
        return []
    want = set(dims)
    seen: set[str] = set()
    for line in lines:
        code = line.split("#", 1)[0]
        seen.update(_NAME.findall(code))
    return [d for d in dims if d in want & seen]


def launcher_args(params: Sequence[str], dims: Sequence[str]) -> str:
    """A launcher's arguments: the tensors, then a range's dimensions as keywords."""
    return ", ".join([*params, *(["*", *dims] if dims else []), "interpret=False"])


@dataclass
class KernelSource:
    name: str
    doc: list[str]
    params: list[str]  # pointer arguments, in order (in0, in1, ..., out0, ...)
    config: LaunchConfig
    body: list[str]
    grid: list[str]  # launcher lines that define `grid`
    helpers: list[Helper] = field(default_factory=list)  # device functions it calls

    def render(self, dims: Sequence[str] = ()) -> str:
        blocks = dict(self.config.blocks)
        used = dims_in(self.body, dims)
        lines = [
            f"# {'-' * 76}",
            *(comment(d) for d in self.doc),
            "@triton.jit",
            f"def {self.name}(",
        ]
        if self.params:
            lines.append("    # pointers")
            lines += [f"    {p}_ptr," for p in self.params]
        if used:
            lines.append("    # dimensions: runtime arguments, one compiled kernel for the range")
            lines += [f"    {d}," for d in used]
        if blocks:
            lines.append("    # meta-parameters")
            lines += [f"    {c}: tl.constexpr," for c in blocks]
        lines.append("):")
        lines += self.body
        lines += ["", "", f"def launch_{self.name}({launcher_args(self.params, dims)}):"]
        fast = {**blocks, **dict(self.config.interpret)}
        if fast != blocks:
            lines.append("    # the interpreter's cost grows with the number of programs")
            lines.append("    if interpret:")
            lines += [f"        {k} = {v}" for k, v in fast.items()]
            lines.append("    else:")
            lines += [f"        {k} = {v}" for k, v in blocks.items()]
        else:
            lines += [f"    {k} = {v}" for k, v in blocks.items()]
        lines += self.grid
        call = [
            *self.params,
            *(f"{d}={d}" for d in used),
            *(f"{k}={k}" for k in blocks),
            f"num_warps={self.config.num_warps}",
            f"num_stages={self.config.num_stages}",
        ]
        lines.append(f"    {self.name}[grid](")
        lines += [f"        {a}," for a in call]
        lines.append("    )")
        return "\n".join(lines) + "\n"


def pointers(graph: Graph, spec: KernelSpec, writes: Sequence[str]) -> Pointers:
    """The pointer names of a kernel: ``in<j>`` for the inputs read from
    memory (scalar constants are literals), ``out<j>`` for what it writes,
    ``err`` for the index error flag of a kernel that checks gathers on the
    device (bound to ``bounds.INDEX_ERROR`` in the KERNELS table), and
    ``partials`` and ``counters`` for a split-K matmul's scratch."""
    reads = [t for t in spec.inputs if not inlined(graph, t)]
    slots = {t: f"in{j}" for j, t in enumerate(reads)}
    slots |= {t: f"out{j}" for j, t in enumerate(writes)}
    if spec.checks:  # the index error flag, last
        slots[INDEX_ERROR] = "err"
    if split_k(spec.config) > 1:  # a split-K matmul's scratch (kernels/spec.py)
        slots |= {SPLIT_K_PARTIALS: "partials", SPLIT_K_COUNTERS: "counters"}
    return Pointers(slots, spec.checks)


def describe(graph: Graph, spec: KernelSpec, writes: Sequence[str], ptrs: Pointers) -> list[str]:
    """Header comment: what the kernel computes and its memory traffic."""
    ops: dict[str, int] = {}
    for n in spec.nodes:
        op = graph.producer[n].op.value
        ops[op] = ops.get(op, 0) + 1
    listing = ", ".join(f"{o} x{c}" if c > 1 else o for o, c in ops.items())
    reads = [t for t in spec.inputs if not inlined(graph, t)]
    read_b = sum(graph.types[t].nbytes for t in reads)
    write_b = sum(graph.types[t].nbytes for t in writes)
    lines = [f"{spec.template} over {list(spec.space)}: {listing}"]
    lines += [f"  reads  {ptrs.name(t)}: {graph.types[t]}" for t in reads]
    lines += [f"  writes {ptrs.name(t)}: {graph.types[t]}" for t in writes]
    if spec.checks:
        k = len(spec.checks)
        lines.append(
            f"  flags  err: int32, set to j when computed gather index j (1..{k}) is out of range"
        )
    lines.append(f"  memory: read {_kb(read_b)}, write {_kb(write_b)}")
    return lines


def _kb(n: int) -> str:
    if isinstance(n, SymInt):  # a formula of a range's dimensions
        return f"{n} B"
    return f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MB"


def store(
    body: Body, graph: Graph, ptrs: Pointers, tensor: str, offset: str, value: str, mask: str | None
) -> None:
    dtype = graph.types[tensor].dtype
    v = value
    if dtype in HALF:  # computed in fp32
        v = f"{value}.to({TL_DTYPE[dtype]})"
    m = f", mask={mask}" if mask else ""
    body.raw(f"tl.store({ptrs.get(tensor)} + {offset}, {v}{m})")


@dataclass(frozen=True)
class Launch:
    """One planned kernel: its launcher and its tensors, in argument order."""

    kernel: str
    function: str
    tensors: tuple[str, ...]


def module(
    functions: Sequence[Function],
    launches: Sequence[Launch],
    title: Sequence[str],
    dims: Sequence = (),
) -> str:
    """The module's source; ``title`` is the docstring's opening lines;
    ``dims`` a range's dimensions (``shapes.family.Dim``)."""
    first, *rest = title
    codes = [d.code for d in dims]
    head = [
        f'"""{docstring(first)}',
        *(docstring(line) for line in rest),
        "",
        "Generated by orchestrate; regenerate rather than edit.  Each function has a",
        "launcher ``launch_<function>(in0, ..., out0, ..., interpret=False)`` taking",
        "torch tensors; ``KERNELS`` binds each planned kernel to a launcher and the",
        "tensors it reads and writes, by name.",
    ]
    if dims:
        head += [
            "",
            "A range of shapes: every launcher takes the dimensions as keywords, and",
            "the kernels that use one take it as a runtime argument:",
            *(f"    {d.code}: {docstring(d.name)} ({d.range.min}..{d.range.max})" for d in dims),
        ]
    head += [
        '"""',
        "",
        "import triton",
        "import triton.language as tl",
    ]
    if any(getattr(f, "calls_torch", False) for f in functions):  # library kernels
        head.append("import torch")
    needed: list[Helper] = []
    for f in functions:
        for h in f.helpers:
            for dep in (*h.requires, h):
                if dep not in needed:
                    needed.append(dep)
    parts = ["\n".join(head)]
    parts += [h.source for h in sorted(needed, key=_helper_order)]
    parts += [f.render(codes) for f in functions]
    table = ["# planned kernel -> (launcher, tensors in argument order)", "KERNELS = {"]
    for launch in launches:
        names = ", ".join(string(t) for t in launch.tensors)
        names += "," if len(launch.tensors) == 1 else ""
        table.append(f"    {string(launch.kernel)}: (launch_{launch.function}, ({names})),")
    table.append("}")
    return "\n\n\n".join(p.rstrip("\n") for p in parts) + "\n\n\n" + "\n".join(table) + "\n"


def _helper_order(h: Helper) -> tuple[int, str]:
    """Library helpers first, in their own order; generated ones after, by name."""
    names = [x.name for x in HELPERS]
    return (names.index(h.name), "") if h.name in names else (len(names), h.name)
