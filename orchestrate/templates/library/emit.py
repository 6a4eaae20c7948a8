"""Library kernels: a plain Python launcher that calls torch, no ``@triton.jit``.

A library spec (``templates/library/rule.py``) prints as a launcher with the same
signature as a generated one, ``launch_<fn>(in0, ..., out0, ...,
interpret=False)``, so the runner, its CUDA-graph capture and the bundle
format treat it as any other kernel.  The call writes into ``out0`` with
``out=`` where torch has it (``addmm``, ``baddbmm``) and copies its result in
where not (``conv*``, ``scaled_dot_product_attention``).  Every shape and
scalar is a literal printed here from the spec; no name from the model
appears (arguments are named by position, as in generated kernels).

    library_matmul     out = alpha * A @ B + beta * bias    torch.addmm / baddbmm
    library_conv       out = conv(x, w) + bias              torch.nn.functional.conv{1,2,3}d
    library_attention  out = softmax(scale * Q @ K + mask) @ V
                                                          scaled_dot_product_attention

Memory traffic is the library's: operands read, the output written (an
operand that broadcasts over the batch is expanded, a view; a bias that
broadcasts over the batch of a batched product is materialised first).
fp32 convolutions run in IEEE fp32 as the plan's Triton kernels do (cuDNN
would take TF32 by default), in TF32 under ``--tf32``; fp32 matmuls follow
torch's own default, IEEE.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from orchestrate.emit.codegen import literal
from orchestrate.emit.helpers import Helper
from orchestrate.emit.source import describe, launcher_args, pointers
from orchestrate.ir import Graph
from orchestrate.kernels.spec import (
    LIBRARY_ATTENTION,
    LIBRARY_CONV,
    LIBRARY_MATMUL,
    KernelSpec,
    LibraryAttention,
    LibraryCall,
)
from orchestrate.text import comment


@dataclass
class LibrarySource:
    """One library launcher (the emitter's peer of ``KernelSource``)."""

    name: str
    doc: list[str]
    params: list[str]  # tensor arguments, in order (in0, in1, ..., out0, ...)
    body: list[str]  # the launcher's lines, indented
    helpers: list[Helper] = field(default_factory=list)  # none: kept for the module's loop
    calls_torch: ClassVar[bool] = True  # the module imports torch for it

    def render(self, dims: Sequence[str] = ()) -> str:
        args = launcher_args(self.params, dims)
        lines = [
            f"# {'-' * 76}",
            *(comment(d) for d in self.doc),
            f"def launch_{self.name}({args}):",
            *self.body,
        ]
        return "\n".join(lines) + "\n"


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _num(v: float) -> str:
    return literal(v, "float64")


def library(graph: Graph, spec: KernelSpec, writes: Sequence[str], name: str) -> LibrarySource:
    ptrs = pointers(graph, spec, writes)
    at = {t: p for t, p in ptrs.slots.items()}
    params = [at[t] for t in spec.inputs if t in at] + [at[t] for t in writes]
    body = _BODIES[spec.template](graph, spec, at)
    doc = describe(graph, spec, writes, ptrs)
    return LibrarySource(name, doc, params, body)


def _matmul(graph: Graph, spec: KernelSpec, at: dict[str, str]) -> list[str]:
    call = spec.roles
    assert isinstance(call, LibraryCall)
    mm = graph.producer[call.anchor]
    a, b = (graph.types[t].shape for t in mm.inputs)
    *batch, m, n = mm.shape
    k = a[-1]
    out = at[spec.outputs[0]]
    lines = [
        f"    # cuBLAS through torch: out = {_num(call.alpha)} * A @ B"
        + (f" + {_num(call.beta)} * bias" if call.bias else "")
    ]
    bias = call.bias
    if len(b) == 2:  # A's batch and rows are one M dimension: one GEMM
        rows = math.prod(a[:-1])
        lines.append(f"    a = {at[mm.inputs[0]]}.view({rows}, {k})")
        lines.append(f"    c = {out}.view({rows}, {n})")
        lines.append(_bias(graph, bias, at, (rows, n), mm.shape, 1))
        lines.append(
            f"    torch.addmm(bias, a, {at[mm.inputs[1]]}, beta={_num(call.beta)}, "
            f"alpha={_num(call.alpha)}, out=c)"
        )
        return lines
    total = math.prod(batch)
    for var, t, rows_cols in (("a", mm.inputs[0], (m, k)), ("b", mm.inputs[1], (k, n))):
        full = (*batch, *rows_cols)
        ref = at[t]
        if graph.types[t].shape != full:  # broadcast over the batch: a view
            ref = f"{ref}.expand{_shape(full)}"
        lines.append(f"    {var} = {ref}.reshape({total}, {rows_cols[0]}, {rows_cols[1]})")
    lines.append(f"    c = {out}.view({total}, {m}, {n})")
    lines.append(_bias(graph, bias, at, (total, m, n), mm.shape, 2))
    lines.append(
        f"    torch.baddbmm(bias, a, b, beta={_num(call.beta)}, alpha={_num(call.alpha)}, out=c)"
    )
    return lines


def _bias(
    graph: Graph,
    bias: str | None,
    at: dict[str, str],
    flat: tuple[int, ...],
    full: tuple[int, ...],
    trailing: int,
) -> str:
    """The line binding ``bias``: the output itself when there is none (beta
    is 0, so torch ignores it); the bias as is when it broadcasts over the
    flattened output by its last ``trailing`` dimensions; else expanded to
    the output and flattened (a copy)."""
    if bias is None:
        return "    bias = c  # beta = 0: not read"
    shape = graph.types[bias].shape
    lead = shape[: max(0, len(shape) - trailing)]
    if all(d == 1 for d in lead):
        tail = shape[len(lead) :] or (1,)
        return f"    bias = {at[bias]}.view{_shape(tail)}"
    return f"    bias = {at[bias]}.expand{_shape(full)}.reshape{_shape(flat)}"


def _conv(graph: Graph, spec: KernelSpec, at: dict[str, str]) -> list[str]:
    call = spec.roles
    assert isinstance(call, LibraryCall)
    cv = graph.producer[call.anchor]
    dims = len(cv.shape) - 2
    pads, strides, dil = cv.attrs["pads"], cv.attrs["strides"], cv.attrs["dilations"]
    x = at[cv.inputs[0]]
    lines = [
        f"    # cuDNN through torch: a {dims}-D convolution"
        + (" and its bias" if call.bias else "")
    ]
    begin, end = tuple(pads[:dims]), tuple(pads[dims:])
    if begin != end:  # torch pads both sides alike: pad the input first
        widths = [w for i in reversed(range(dims)) for w in (begin[i], end[i])]
        lines.append(f"    {x} = torch.nn.functional.pad({x}, {_shape(widths)})")
        begin = (0,) * dims
    bias = "None"
    if call.bias:  # one value per output channel, or one for all of them
        one = graph.types[call.bias].size == 1
        bias = f"{at[call.bias]}.reshape({1 if one else cv.shape[1]})"
        bias += f".expand({cv.shape[1]})" if one else ""
    indent = "    "
    if graph.types[cv.inputs[0]].dtype == "float32":
        if spec.config.precision == "tf32":
            lines.append("    # TF32 tensor cores, as --tf32 allows (and cuDNN's default)")
        else:
            lines.append(
                "    # IEEE fp32, as the plan's generated kernels (cuDNN defaults to TF32)"
            )
        tf32 = spec.config.precision == "tf32"
        lines.append(f"    with torch.backends.cudnn.flags(enabled=True, allow_tf32={tf32}):")
        indent = "        "
    lines += [
        f"{indent}y = torch.nn.functional.conv{dims}d(",
        f"{indent}    {x}, {at[cv.inputs[1]]}, {bias}, stride={_shape(strides)}, "
        f"padding={_shape(begin)},",
        f"{indent}    dilation={_shape(dil)}, groups={cv.attrs['group']},",
        f"{indent})",
    ]
    lines.append(f"    {at[spec.outputs[0]]}.copy_(y)")
    return lines


def _attention(graph: Graph, spec: KernelSpec, at: dict[str, str]) -> list[str]:
    s = spec.roles
    assert isinstance(s, LibraryAttention)
    m1, m2 = graph.producer[s.m1], graph.producer[s.m2]
    *batch, lq, lk = m1.shape
    d, dv = graph.types[m1.inputs[0]].shape[-1], m2.shape[-1]
    flat = len(batch) not in (1, 2)  # SDPA takes (N, L, E) or (N, H, L, E)
    lead = (math.prod(batch),) if flat else tuple(batch)
    lines = ["    # scaled_dot_product_attention: softmax(scale * Q @ K^T + mask) @ V"]
    operands = (
        ("q", m1.inputs[0], (lq, d), False),
        ("k", m1.inputs[1], (lk, d), True),
        ("v", m2.inputs[1], (lk, dv), False),
    )
    for var, t, tail, transposed in operands:
        ref = at[t] + (".transpose(-2, -1)" if transposed else "")
        shape = graph.types[t].shape
        if tuple(shape[:-2]) != tuple(batch):
            ref += f".expand{_shape((*batch, *tail))}"
        if flat:
            ref += f".reshape{_shape((*lead, *tail))}"
        lines.append(f"    {var} = {ref}")
    mask = "None"
    if s.causal:  # a constant causal mask: SDPA's is_causal instead of a tensor
        mask = "None, is_causal=True"
    elif s.mask is not None:
        ref = at[s.mask]
        if flat:
            ref += f".expand{_shape((*batch, lq, lk))}.reshape{_shape((*lead, lq, lk))}"
        dtype = "torch.bool" if s.boolean_mask else "q.dtype"
        invert = "~" if s.hides else ""  # SDPA's boolean mask marks the keys kept
        lines.append(f"    mask = {invert}{ref}.to({dtype})")
        mask = "mask"
    lines += [
        "    o = torch.nn.functional.scaled_dot_product_attention(",
        f"        q, k, v, attn_mask={mask}, scale={_num(s.scale)}",
        "    )",
    ]
    lines.append(f"    {at[spec.outputs[0]]}.view{_shape((*lead, lq, dv))}.copy_(o)")
    return lines


_BODIES = {LIBRARY_MATMUL: _matmul, LIBRARY_CONV: _conv, LIBRARY_ATTENTION: _attention}
