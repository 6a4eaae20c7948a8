"""The conv template: a convolution as an implicit GEMM, per group.

    y[n, g*Mg + m, *o] = sum over (c, *kd) of
        x[n, g*Cg + c, *(o * stride - pad_begin + kd * dilation)] * w[g*Mg + m, c, *kd]

seen as one GEMM per group g (grid axis 1):

* GEMM-M: the output pixels (n, *o), N * prod(out spatial) rows;
* GEMM-N: the group's Mg = M / group output channels;
* GEMM-K: (c, *kd), Cg * kernel volume, walked in BLOCK_K steps.

The A tile is gathered from x: each (row, column) pair names an input pixel,
masked where it falls into the padding.  The B tile is the weight viewed as
(M, Cg * kernel volume), read transposed.  Accumulation is fp32 (``tl.dot``
with ``input_precision="ieee"`` for fp32, plain tensor-core dots for fp16
and bf16).  The aligned elementwise epilogue (bias, BN scale/shift, ReLU,
residual add, ...) is evaluated on the accumulator at the output multi-index
(n, channel, *o) and every written value is stored to the NCHW output.

Memory traffic: x is read once per column of tiles (each input pixel is
gathered by up to kernel-volume rows; those re-reads hit L1/L2), the weight
once per row of tiles, epilogue inputs once, outputs written once.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import cdiv_text
from orchestrate.emit.expr import Const, Expr, Sym, and_, ge, lt, ne
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import HALF, Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.shapes.symint import upper
from orchestrate.templates.matmul.emit import WIDE, epilogue, grouped_tile

AXES = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}


def conv(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    cv = graph.producer[k.roles.anchor]
    x_name, w_name = cv.inputs
    x_t, w_t = graph.types[x_name], graph.types[w_name]
    dtype = x_t.dtype
    nb, c, *in_sp = x_t.shape
    m, cg, *kern = w_t.shape
    out_sp = list(cv.shape[2:])
    nd = len(in_sp)
    groups = cv.attrs["group"]
    strides, pads, dil = cv.attrs["strides"], cv.attrs["pads"], cv.attrs["dilations"]
    mg = m // groups
    axes = AXES.get(nd) or tuple(f"s{i}" for i in range(nd))
    kvol = math.prod(kern)
    gemm_m, gemm_n, gemm_k = nb * math.prod(out_sp), mg, cg * kvol
    in_vol, out_vol = math.prod(in_sp), math.prod(out_sp)
    wide = any(upper(graph.types[t].size) >= WIDE for t in set(k.inputs) | set(k.nodes))
    wid = ".to(tl.int64)" if wide else ""
    itype = "tl.int64" if wide else "tl.int32"

    body = Body()
    ptrs = pointers(graph, k, writes)
    geometry = ", ".join(
        f"{a}: k={kern[i]} stride={strides[i]} pad=({pads[i]}, {pads[i + nd]}) dilation={dil[i]}"
        for i, a in enumerate(axes)
    )
    body.comment(
        f"y{list(cv.shape)} = conv(x{list(x_t.shape)}, w{list(w_t.shape)}), group {groups}; "
        + geometry
    )
    body.comment(
        f"implicit GEMM per group: [{gemm_m} pixels, {gemm_k}] @ [{gemm_k}, {gemm_n} channels]"
    )
    grouped_tile(body, gemm_m, gemm_n)
    body.raw(f"grp = tl.program_id(1){wid}")
    body.comment("rows: output pixels (n, *o); columns: output channels of the group")
    body.raw(f"rm = pid_m{wid} * BLOCK_M + tl.arange(0, BLOCK_M)")
    body.raw(f"rn = pid_n{wid} * BLOCK_N + tl.arange(0, BLOCK_N)")
    body.raw(f"mask_m = rm < {gemm_m}")
    body.raw(f"mask_n = rn < {gemm_n}")
    rm, rn = Sym("rm", 0, gemm_m), Sym("rn", 0, gemm_n)
    grp = Sym("grp", 0, groups, lane=False)
    # output pixel of each row
    n_img = _component(body, rm, "n_img", out_vol, nb, outer=True)
    o = [
        _component(
            body, rm, f"o_{a}", math.prod(out_sp[i + 1 :]), out_sp[i], outer=nb == 1 and i == 0
        )
        for i, a in enumerate(axes)
    ]
    co = body.define("co", grp * mg + rn)
    body.comment("first input position of each row's window")
    start = [body.define(f"i0_{a}", o[i] * strides[i] - pads[i]) for i, a in enumerate(axes)]
    zero_a = body.lazy("zero_a", f"tl.zeros((BLOCK_M, BLOCK_K), dtype={itype})")
    body.raw("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")

    # -- K loop: gather the A tile, load the B tile ------------------------------
    body.comment(f"walk GEMM-K = (c, *kd) = {gemm_k} in BLOCK_K steps")
    body.raw(f"for k0 in range(0, {gemm_k}, BLOCK_K):")
    loop = body.fork(body.indent + "    ")
    loop.raw(
        f"rk = (k0 + tl.arange(0, BLOCK_K)){wid}" if wide else "rk = k0 + tl.arange(0, BLOCK_K)"
    )
    loop.raw(f"mask_k = rk < {gemm_k}")
    rk = Sym("rk", 0, gemm_k)
    ci = _component(loop, rk, "c_in", kvol, cg, outer=True)
    kd = [
        _component(loop, rk, f"k_{a}", math.prod(kern[i + 1 :]), kern[i], outer=cg == 1 and i == 0)
        for i, a in enumerate(axes)
    ]
    loop.comment("input pixel of each (row, column); masked where it is padding")
    conds: list[Expr | None] = [Sym("mask_m[:, None]"), Sym("mask_k[None, :]")]
    offset: Expr = zero_a + _row(n_img) * (c * in_vol) + grp * (cg * in_vol) + _col(ci) * in_vol
    for i, a in enumerate(axes):
        pos = loop.define(f"i_{a}", _row(start[i]) + _col(kd[i]) * dil[i])
        if isinstance(pos, Const) and not 0 <= pos.value < in_sp[i]:
            conds.append(ne(zero_a, 0))  # this axis reads only padding
        else:
            conds += [ge(pos, 0), lt(pos, in_sp[i])]
        offset = offset + pos * math.prod(in_sp[i + 1 :])
    mask_a = and_(*conds)
    loop.raw(f"mask_a = {loop.text(mask_a)}")
    loop.raw("mask_b = mask_k[:, None] & mask_n[None, :]")
    x_ptr, w_ptr = ptrs.get(x_name), ptrs.get(w_name)
    w_offset = _col(co) * gemm_k + Sym("rk[:, None]")
    loop.raw(f"a = tl.load({x_ptr} + {loop.text(offset)}, mask=mask_a, other=0.0)")
    loop.raw(f"b = tl.load({w_ptr} + {loop.text(w_offset)}, mask=mask_b, other=0.0)")
    if dtype in HALF:
        short = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
        loop.raw(f"acc += tl.dot(a, b)  # {short} tensor cores, fp32 accumulation")
    else:
        loop.raw(f'acc += tl.dot(a, b, input_precision="{k.config.precision}")')
    body.lines += loop.lines

    # -- epilogue on the accumulator ----------------------------------------
    body.comment("epilogue on the accumulator tile at the output index (n, channel, *o)")
    dims = (_row(n_img), _col(co)) + tuple(_row(e) for e in o)
    results = epilogue(graph, k, body, ptrs, dims, itype, writes, name)
    body.comment(f"NCHW offsets: n * {m * out_vol} + channel * {out_vol} + pixel")
    offs_c = _row(n_img) * (m * out_vol) + _row(rm) % out_vol + _col(co) * out_vol
    if gemm_m == 1:  # no term varies along the rows: keep the tile's shape
        offs_c = Sym("zero_c") + offs_c
    body.raw(f"offs_c = {body.text(offs_c)}")
    for t in writes:
        store(body, graph, ptrs, t, "offs_c", results[t], "mask_c")

    doc = describe(graph, k, writes, ptrs) + [
        f"  traffic: each input pixel is gathered by up to {kvol} rows of a tile and x by "
        f"{cdiv_text(gemm_n, k.config['BLOCK_N'])} column(s) of tiles,",
        f"  w by {cdiv_text(gemm_m, k.config['BLOCK_M'])} row(s) of tiles: re-reads hit L1/L2; "
        "epilogue inputs read once, outputs written once.",
    ]
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[
            f"    grid = (triton.cdiv({gemm_m}, BLOCK_M) * triton.cdiv({gemm_n}, BLOCK_N), "
            f"{groups})",
        ],
    )


def _component(
    body: Body, linear: Expr, name: str, inner: int, size: int, outer: bool = False
) -> Expr:
    """The component of a row-major ``linear`` index with inner volume ``inner``
    (``outer``: the outermost one, no modulo; masked lanes may run past it)."""
    if size == 1:
        return Const(0)
    e = linear // inner
    return body.define(name, e if outer else e % size)


def _row(e: Expr) -> Expr:
    """A per-row vector (or a constant) as a (BLOCK_M, 1) column."""
    return Sym(f"{e.name}[:, None]", e.lo, e.hi, e.lane) if isinstance(e, Sym) else e


def _col(e: Expr) -> Expr:
    """A per-column vector (or a constant) as a (1, BLOCK_K) row."""
    return Sym(f"{e.name}[None, :]", e.lo, e.hi, e.lane) if isinstance(e, Sym) else e
