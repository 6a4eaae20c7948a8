"""The window template: one POOL with an elementwise prologue and epilogue.

One program per BLOCK output elements.  Each program maps its flat offsets
to the output multi-index (n, c, *out), then walks the kernel window (one
loop per spatial axis: ``tl.static_range`` when the window is small, a
runtime ``range`` when it is large) and, at every tap, evaluates the
prologue at the input position (n, c, *(out * stride - pad + tap * dilation))
with a masked load.  Taps that fall in the pool's padding contribute the
neutral value *after* the prologue: -inf for max, 0 for avg.  The window is
accumulated in fp32 (max propagates NaN as numpy's ``np.maximum`` does; avg
divides the window sum by the full kernel volume).  The epilogue then runs
at the output index with the pooled value in registers, and every written
tensor is stored under the output mask.

Memory traffic: each output reads its whole window, but neighbouring
windows share input elements, so the input comes from device memory about
once (re-reads hit the cache); each output is written once.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import Evaluator, Index, split_linear
from orchestrate.emit.expr import Const, Expr, Sym, and_, ge, lt
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.shapes.symint import upper

# windows with more taps than this loop at runtime instead of being unrolled
UNROLL_LIMIT = 64

_TAP_NAMES = {1: ("kx",), 2: ("ky", "kx"), 3: ("kz", "ky", "kx")}


def window(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    pool = graph.producer[k.roles.anchor]
    epilogue = set(k.roles.epilogue)
    prologue = set(k.roles.prologue)
    x = pool.inputs[0]
    x_shape = graph.types[x].shape
    spatial = len(x_shape) - 2
    a = pool.attrs
    kernel, strides, dil, pads = a["kernel"], a["strides"], a["dilations"], a["pads"]
    volume = math.prod(kernel)
    numel = math.prod(k.space)
    largest = max([upper(numel)] + [upper(graph.types[t].size) for t in k.inputs])

    body = Body()
    ptrs = pointers(graph, k, writes)
    body.comment("map the program id to a block of output elements")
    body.raw("pid = tl.program_id(0)")
    body.raw(
        "offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)"
        if largest >= 2**31
        else "offs = pid * BLOCK + tl.arange(0, BLOCK)"
    )
    body.raw(f"mask = offs < {numel}")
    zero = body.lazy("zero", "offs * 0")  # a block-shaped zero
    body.comment(f"multi-index (n, c, *out) into the output {list(k.space)}")
    out = split_linear(body, Sym("offs", 0, numel), k.space)
    body.comment("first input position of each window per axis (negative inside the padding)")
    corner = []
    for i in range(spatial):
        # block-shaped even on an output axis of size 1, so every tap's load
        # offset (and pointer) has the shape of its mask
        o = out[2 + i] * strides[i]
        if isinstance(o, Const):  # an output axis of size 1
            o = zero + o
        corner.append(body.let(o - pads[i], "h"))

    is_max = pool.attrs["kind"] == "max"
    if is_max:
        body.raw('acc = tl.full([BLOCK], float("-inf"), tl.float32)')
    else:
        body.raw("acc = tl.zeros([BLOCK], dtype=tl.float32)")
    unrolled = volume <= UNROLL_LIMIT
    loop = "tl.static_range" if unrolled else "range"
    body.comment(
        f"window {'x'.join(map(str, kernel))}"
        + (f" (dilation {'x'.join(map(str, dil))})" if any(d != 1 for d in dil) else "")
        + (", unrolled" if unrolled else f": {volume} taps, looped at runtime")
    )

    levels, pos, tap_mask = _loops(body, pool, x_shape, k.space, corner, loop)
    inner = levels[-1]
    ev = Evaluator(graph, prologue, inner, ptrs, mask=Sym("mask"), zero=zero)
    dims = (out[0], out[1], *pos)
    neutral = 'float("-inf")' if is_max else "0.0"
    inner.comment(
        ("evaluate the prologue at the tap" if prologue else "load the tap")
        + (f"; padding taps count as {'-inf' if is_max else '0'}" if tap_mask else "")
        + (" after the prologue" if tap_mask and prologue else "")
    )
    v = ev.value(x, Index(dims, tap_mask))
    if not v.isidentifier():  # a literal (size-1 constant input): make it a block
        v = inner.let(f"tl.full([BLOCK], {v}, tl.float32)", "v")
    if tap_mask is not None:
        v = inner.let(f"tl.where({inner.text(tap_mask)}, {v}, {neutral})", "v")
    if is_max:
        inner.raw(
            f"acc = tl.where(({v} > acc) | ({v} != {v}), {v}, acc)  # NaN wins, as np.maximum"
        )
    else:
        inner.raw(f"acc += {v}")
    for parent, child in reversed(list(zip(levels, levels[1:]))):
        parent.lines += child.lines

    if is_max:
        pooled = "acc"
    else:
        body.comment(f"the average divides by the full window ({volume} taps), padding included")
        pooled = body.let(f"acc / {float(volume)!r}", "pooled")
    ev_out = Evaluator(graph, epilogue, body, ptrs, mask=Sym("mask"), zero=zero)
    out_index = Index(out)

    def provide(index: Index) -> str:
        if index.dims != out:
            raise AssertionError(f"{name}: epilogue reads {pool.name} off the output index")
        return pooled

    ev_out.provided[pool.name] = provide
    if epilogue:
        body.comment("epilogue at the output index")
    results = {t: ev_out.value(t, out_index) for t in writes}
    body.comment("store")
    for t in writes:
        store(body, graph, ptrs, t, "offs", results[t], "mask")

    doc = describe(graph, k, writes, ptrs)
    doc[1:1] = [
        f"  {pool.attrs['kind']} pool: kernel {list(kernel)}, strides {list(strides)}, "
        f"pads {list(pads)}, dilations {list(dil)}",
        f"  {volume} loads per output; overlapping windows re-read the input from cache",
    ]
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[f"    grid = (triton.cdiv({numel}, BLOCK),)"],
    )


def _loops(body: Body, pool, x_shape, out_shape, corner: list[Expr], loop: str):
    """Open one loop per spatial axis with more than one tap; each axis's
    input position and bounds check is computed at its own loop level.
    Returns the bodies (outermost first), the positions and the tap mask
    (None when no tap can fall in the padding)."""
    a = pool.attrs
    kernel, strides, dil, pads = a["kernel"], a["strides"], a["dilations"], a["pads"]
    levels = [body]
    pos, inside = [], []
    for i, tap in enumerate(_TAP_NAMES[len(kernel)]):
        b = levels[-1]
        size = x_shape[2 + i]
        if kernel[i] > 1:
            b.raw(f"for {tap} in {loop}({kernel[i]}):")
            b = b.fork(b.indent + "    ")
            levels.append(b)
            h = b.let(corner[i] + Sym(tap, 0, kernel[i], lane=False) * dil[i], "h")
        else:
            h = corner[i]
        pos.append(h)
        # positions read on this axis run from -pads[i] to `last`
        last = (out_shape[2 + i] - 1) * strides[i] - pads[i] + (kernel[i] - 1) * dil[i]
        cond = and_(ge(h, 0) if pads[i] > 0 else None, lt(h, size) if last >= size else None)
        if cond is not None:
            inside.append(b.let(cond, "m"))
    inner = levels[-1]
    tap_mask = and_(*inside)
    return levels, pos, None if tap_mask is None else inner.let(tap_mask, "m")
