"""Assembling generated kernels into one readable Python module.

Each kernel is a ``@triton.jit`` function with its arguments grouped
(pointers, then ``tl.constexpr`` meta-parameters) and a launcher
``launch_<name>(env, interpret=False)`` that takes a dict of torch tensors by
tensor name, builds the grid and launches.  In interpreter mode (no GPU) the
launchers pick larger blocks: the interpreter's cost grows with the number of
programs, not with the block size.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from orchestrate.emit.codegen import TL_DTYPE, Body, Pointers
from orchestrate.emit.helpers import HELPERS
from orchestrate.ir import Graph
from orchestrate.kernels.templates import Kernel


@dataclass
class KernelSource:
    name: str
    doc: list[str]
    args: list[tuple[str, str]]  # (tensor name, pointer argument)
    constexprs: dict[str, int]
    body: list[str]
    grid: list[str]  # launcher lines that define `grid`
    interpret_constexprs: dict[str, int] = field(default_factory=dict)
    prelude: list[str] = field(default_factory=list)  # module-level helpers

    def render(self) -> str:
        lines = [f"# {'-' * 76}", *(f"# {d}" for d in self.doc), "@triton.jit", f"def {self.name}("]
        if self.args:
            lines.append("    # pointers")
            lines += [f"    {ptr}," for _, ptr in self.args]
        if self.constexprs:
            lines.append("    # meta-parameters")
            lines += [f"    {c}: tl.constexpr," for c in self.constexprs]
        lines.append("):")
        lines += self.body
        lines += ["", "", f"def launch_{self.name}(env, interpret=False):"]
        consts = ", ".join(f"{k}={v}" for k, v in self.constexprs.items())
        if self.interpret_constexprs and self.interpret_constexprs != {
            k: self.constexprs[k] for k in self.interpret_constexprs
        }:
            fast = {**self.constexprs, **self.interpret_constexprs}
            lines.append("    # the interpreter's cost grows with the number of programs")
            lines.append("    if interpret:")
            lines += [f"        {k} = {v}" for k, v in fast.items()]
            lines.append("    else:")
            lines += [f"        {k} = {v}" for k, v in self.constexprs.items()]
            consts = ", ".join(f"{k}={k}" for k in self.constexprs)
        else:
            lines += [f"    {k} = {v}" for k, v in self.constexprs.items()]
            consts = ", ".join(f"{k}={k}" for k in self.constexprs)
        lines += self.grid
        call_args = ", ".join(f"env[{json.dumps(t)}]" for t, _ in self.args)
        sep = ", " if call_args and consts else ""
        lines.append(f"    {self.name}[grid]({call_args}{sep}{consts})")
        return "\n".join(lines) + "\n"


def describe(graph: Graph, k: Kernel, writes) -> list[str]:
    """Header comment: what the kernel computes and its memory traffic."""
    ops: dict[str, int] = {}
    for n in k.nodes:
        op = graph.producer[n].op.value
        ops[op] = ops.get(op, 0) + 1
    listing = ", ".join(f"{o} x{c}" if c > 1 else o for o, c in ops.items())
    reads = [t for t in k.inputs if not _inlined(graph, t)]
    read_b = sum(graph.types[t].nbytes for t in reads)
    write_b = sum(graph.types[t].nbytes for t in writes)
    lines = [f"{k.template} over {list(k.space)}: {listing}"]
    lines += [f"  reads  {t}: {graph.types[t]}" for t in reads]
    lines += [f"  writes {t}: {graph.types[t]}" for t in writes]
    lines.append(f"  memory: read {_kb(read_b)}, write {_kb(write_b)}")
    return lines


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MB"


def _inlined(graph: Graph, t: str) -> bool:
    c = graph.constants.get(t)
    return c is not None and c.size == 1


def store(body: Body, graph: Graph, pointers: Pointers, tensor: str, offset: str, value: str,
          mask: str | None) -> None:  # fmt: skip
    dtype = graph.types[tensor].dtype
    v = value
    if dtype == "float16":  # computed in fp32
        v = f"{value}.to({TL_DTYPE[dtype]})"
    ptr = pointers.get(tensor)
    m = f", mask={mask}" if mask else ""
    body.raw(f"tl.store({ptr} + {offset}, {v}{m})")


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _functions(text: str) -> list[tuple[str, str]]:
    """(name, source) of each ``@triton.jit`` function in ``text``."""
    out = []
    for block in re.split(r"\n(?=@triton\.jit)", text.strip("\n")):
        m = re.search(r"def (\w+)\(", block)
        if m:
            out.append((m.group(1), block.strip("\n")))
    return out


def _used_helpers(kernels: list[KernelSource], helpers: list[tuple[str, str]]) -> list[str]:
    """Helper sources called by the kernels (directly or through other helpers)."""
    text = "\n".join(k.render() for k in kernels)
    used: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, src in helpers:
            if name not in used and re.search(rf"\b{name}\b", text):
                used.add(name)
                text += "\n" + src.split("\n", 2)[-1]  # its body may call others
                changed = True
    return [src for name, src in helpers if name in used]


def module(kernels: list[KernelSource], title: str) -> str:
    head = [
        f'"""{title}',
        "",
        "Generated by orchestrate; regenerate rather than edit.  Each kernel has a",
        "launcher ``launch_<name>(env, interpret=False)`` that reads and writes the",
        "torch tensors in ``env`` by tensor name.",
        '"""',
        "",
        "import triton",
        "import triton.language as tl",
    ]
    helpers = _functions(HELPERS)
    for k in kernels:
        for p in k.prelude:
            for name, src in _functions(p):
                if name not in dict(helpers):
                    helpers.append((name, src))
    parts = ["\n".join(head)] + _used_helpers(kernels, helpers) + [k.render() for k in kernels]
    table = ["LAUNCHERS = {"] + [f'    "{k.name}": launch_{k.name},' for k in kernels] + ["}"]
    return "\n\n\n".join(p.rstrip("\n") for p in parts) + "\n\n\n" + "\n".join(table) + "\n"
