"""The low-rank side-branch rule: x @ W + alpha (x @ A) @ B as one concatenated matmul.

LoRA adapters and low-rank factorised layers add a thin second path beside
a projection.  In row-vector form, as ONNX exports it:

    C = MATMUL(x, W)        W constant [K, N]
    P = C + bias ...        optionally: adds of values that do not depend on C
    T = MATMUL(x, A)        A constant [K, r], r small (LoRA: 4 to 64)
    U = MATMUL(T, B)        B constant [r, N]
    V = U * c ... / c       optionally: scalar constants (LoRA's alpha / r)
    Y = P + V               the join
    Z = elementwise(Y, ...) optionally: an activation, a residual

In real arithmetic Y = [x | alpha T] @ [W ; B] + bias: one matmul over K + r.
The replacement (``templates/low_rank/emit.py``) is one matmul kernel whose K loop
loads each x tile once and feeds two dots, x @ W into the output tile's
accumulator and x @ A into a (BLOCK_M, r) accumulator kept in registers;
after the loop it adds (alpha T) @ B for its columns, the last r steps of
the concatenated K, then runs P's adds, the join's readers and the stores.
T, U and P are never written: as separate kernels T and U go through memory
and the join reads C (or P) back.  Each column of tiles recomputes its rows'
x @ A (M x K x r multiply-adds per column of tiles, priced by the cost model;
small for r << N).

The roles (``LowRank``, ``roles.py``) record what the kernel computes: the activation, the
three matmuls, the scale nodes whose product is alpha, the main-side value P
the join adds to, and ``rank``, the columns the concatenation adds.  The
exact checker (``exact/check.py``) evaluates those, not the nodes they
replace: one matmul of [x | alpha (x @ A)[:, :rank]] by [W ; B[:rank]], then
P's adds on it, and P as the join's value, so a dropped term, a dropped
alpha or a wrong rank slice is a wrong value.

The check declines, with the reason: a weight that is not a constant, shapes
or dtypes that do not match, a rank above ``MAX_RANK`` (the (BLOCK_M, r)
fp32 accumulator lives in registers beside the output tile's), T, U, the
scaled term or P needed outside the set (read there or a graph output: the
kernel never forms them, P only with the low-rank term added), a main path that is not adds of values independent of C (then P + V
is not P's adds on C + V), and tiles that do not fit.  No split-K: each
program needs the whole K for its rows' x @ A.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrate import ir
from orchestrate.ir import HALF, Graph, Node, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.fit import WorkingSet
from orchestrate.kernels.region import Region, ancestors_within, descendants_within
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import KernelSpec, Rejection, Target
from orchestrate.templates.low_rank.roles import NAME, LowRank

DOT_DTYPES = ("float16", "bfloat16", "float32")
MAX_BATCH = 65535  # the batch runs on grid axis 1
WIDE = 2**31  # offsets are int32
# x @ A for the tile's rows stays in registers as a (BLOCK_M, rank padded to a
# power of two) fp32 accumulator beside the (BLOCK_M, BLOCK_N) output tile's.
# Up to 128 (BLOCK_R 128) sm_90 compiles at BLOCK_M 64 do not spill; at 256
# the accumulator alone is 128 fp32 registers a thread at BLOCK_M 64 and 4
# warps, so only small tiles would fit, each column of them recomputing a
# product as large as the matmul's own: a rank that large is no side branch
MAX_RANK = 128


def _judges(graph: Graph, r: Region) -> bool:
    return len(r.anchors) == 3 and all(a.op is Op.MATMUL for a in r.anchors) and not r.reductions


def low_rank(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    """One matmul kernel over [x | alpha x @ A] @ [W ; B], or why not."""
    found = analyse(graph, r)
    if isinstance(found, Rejection):
        return found
    mm = graph.producer[found.anchor]
    x = graph.types[found.x]
    *batch, m, n = mm.shape
    # no split-K (sms 0): every program walks the whole K for its rows' x @ A
    configs = config.matmul(m, n, x.shape[-1], x.dtype, target.tf32, math.prod(batch), 0)
    after = set(found.epilogue[found.epilogue.index(found.join) :])
    optional = tuple(e for e in r.exposed if e in after)
    return accept(graph, RULE, r, mm.shape, found, optional, configs, target)


def analyse(graph: Graph, r: Region) -> LowRank | Rejection:
    """The roles of the set's nodes, or why the side branch cannot join the matmul."""
    found = _matmuls(graph, r)
    if isinstance(found, str):
        return Rejection(found)
    mm, down, up = found
    x = mm.inputs[0]
    xt = graph.types[x]
    if x in r.inside:
        return Rejection(f"the activation {x} is computed in the set (low_rank takes no prologue)")
    if xt.dtype not in DOT_DTYPES:
        return Rejection(f"{x} is {xt.dtype}: low_rank runs float16 / bfloat16 / float32")
    k = xt.shape[-1]
    rank = graph.types[down.inputs[1]].shape[-1]
    for node, rows, cols in ((mm, k, mm.shape[-1]), (down, k, rank), (up, rank, mm.shape[-1])):
        reason = _check_weight(graph, node, rows, cols, xt.dtype)
        if reason:
            return Rejection(reason)
    if up.shape != mm.shape:
        return Rejection(
            f"{up.name} {list(up.shape)} is not aligned with {mm.name} {list(mm.shape)}"
        )
    if rank > MAX_RANK:
        padded = 1 << (rank - 1).bit_length()
        return Rejection(
            f"rank {rank} of {down.inputs[1]} exceeds {MAX_RANK}: each program keeps "
            f"x @ A for its rows in registers (BLOCK_M x {padded} fp32 beside the "
            "output tile), which leaves room for small tiles only"
        )
    written = set(r.exposed) | set(r.sinks)
    for t in (down.name, up.name):
        if t in written:
            return Rejection(
                f"{t} must be written (read outside the set or a graph output), "
                "but the kernel keeps the low-rank branch in registers"
            )
    scaling, v = _scaling(graph, up.name, r)
    join = next((c for c in graph.consumers.get(v, ()) if c.name in r.inside), None)
    if join is None or join.op is not Op.ADD or join.shape != mm.shape:
        what = "nothing" if join is None else f"{join.name} ({join.op.value})"
        return Rejection(
            f"the low-rank term {v} is not added to the matmul's result ({v} feeds {what})"
        )
    if v in written:
        return Rejection(
            f"{v} must be written (read outside the set or a graph output), but "
            "the kernel never forms the low-rank term on its own"
        )
    p = join.inputs[1] if join.inputs[0] == v else join.inputs[0]
    path = _main_path(graph, mm.name, p, r)
    if isinstance(path, str):
        return Rejection(path)
    exposed = next((t for t in (mm.name, *path) if t in written), None)
    if exposed is not None:
        return Rejection(
            f"{exposed} must be written (read outside the set or a graph output), "
            "but the kernel forms it only with the low-rank term added"
        )
    branch = {down.name, up.name, *scaling}
    before = {mm.name, *path} | branch
    after = descendants_within(graph, join.name, r.inside)
    for t in sorted(after, key=graph.position.__getitem__):
        node = graph.producer[t]
        if node.op not in ir.ELEMENTWISE or node.shape != mm.shape:
            return Rejection(
                f"{t} ({node.op.value}) cannot run in a matmul epilogue aligned with {mm.name}"
            )
        mixed = next((i for i in node.inputs if i in before), None)
        if mixed is not None:
            return Rejection(f"{t} reads {mixed}, which the kernel never forms on its own")
    claimed = before | after | {join.name}
    stray = next((t for t in r.names if t not in claimed), None)
    if stray is not None:
        op = graph.producer[stray].op.value
        return Rejection(
            f"{stray} ({op}) is neither the matmul, its low-rank branch nor its epilogue"
        )
    big = next((t for t in (*r.inputs, *r.names) if graph.types[t].size >= WIDE), None)
    if big is not None:
        return Rejection(f"{big} has 2**31 elements or more (int32 offsets)")
    if math.prod(mm.shape[:-2]) > MAX_BATCH:
        return Rejection(f"batch of {math.prod(mm.shape[:-2])} exceeds grid axis 1")
    order = graph.position.__getitem__
    epilogue = tuple(sorted({*path, join.name, *after}, key=order))
    return LowRank(mm.name, (), epilogue, x, down.name, up.name, scaling, p, join.name, rank)


def _matmuls(graph: Graph, r: Region) -> tuple[Node, Node, Node] | str:
    """(C = x @ W, T = x @ A, U = T @ B) among the set's three matmuls."""
    names = {a.name for a in r.anchors}
    ups = [a for a in r.anchors if a.inputs[0] in names]
    if len(ups) != 1:
        return (
            f"the three matmuls are not x @ W, x @ A and (x @ A) @ B ({', '.join(sorted(names))})"
        )
    up = ups[0]
    down = graph.producer[up.inputs[0]]
    mms = [a for a in r.anchors if a is not up and a is not down]
    if len(mms) != 1 or mms[0].inputs[0] != down.inputs[0]:
        return (
            f"{up.name}'s branch starts from {down.inputs[0]}, which no other matmul of "
            "the set multiplies"
        )
    return mms[0], down, up


def _check_weight(graph: Graph, a: Node, rows: int, cols: int, dtype: str) -> str | None:
    w = a.inputs[1]
    wt = graph.types[w]
    if w not in graph.constants:
        return f"{a.name}'s second operand {w} is not a constant weight"
    if wt.shape != (rows, cols):
        return f"{a.name}'s weight {w} is {list(wt.shape)}, not [{rows}, {cols}]"
    if wt.dtype != dtype:
        return f"{a.name}'s weight {w} is {wt.dtype}, the activation {dtype}"
    return None


def _scaling(graph: Graph, u: str, r: Region) -> tuple[tuple[str, ...], str]:
    """U's chain of MUL / DIV by scalar constants in the set, each the only
    reader of the one before, and the value it ends at."""
    chain: list[str] = []
    while u not in r.exposed and u not in r.sinks:
        readers = [c for c in graph.consumers.get(u, ()) if c.name in r.inside]
        if len(readers) != 1 or not _scales(graph, readers[0], u):
            break
        chain.append(readers[0].name)
        u = readers[0].name
    return tuple(chain), u


def _scales(graph: Graph, node: Node, u: str) -> bool:
    if node.op is Op.MUL:
        other = node.inputs[1] if node.inputs[0] == u else node.inputs[0]
    elif node.op is Op.DIV and node.inputs[0] == u:
        other = node.inputs[1]
    else:
        return False
    c = graph.constants.get(other)
    return c is not None and c.size == 1 and float(c.reshape(())) != 0.0


def _main_path(graph: Graph, mm: str, p: str, r: Region) -> tuple[str, ...] | str:
    """The adds from C to P, each adding a value that does not depend on C
    (C as a SUB's first operand), so P(C) + V = P(C + V)."""
    path: list[str] = []
    t = p
    while t != mm:
        node = graph.producer.get(t) if t in r.inside else None
        if node is None:
            return f"the join adds the low-rank term to {p}, which does not come from {mm}"
        ins = node.inputs
        chained = [
            i
            for i in ins
            if i == mm or i in r.inside and mm in ancestors_within(graph, i, r.inside)
        ]
        ok = (
            (node.op is Op.ADD or node.op is Op.SUB and chained[:1] == [ins[0]])
            and len(chained) == 1
            and node.shape == graph.producer[mm].shape
        )
        if not ok:
            return (
                f"{t} ({node.op.value}) lies between {mm} and the join: only adds of values "
                "independent of the matmul commute with adding the low-rank term"
            )
        path.append(t)
        t = chained[0]
    return tuple(reversed(path))


# -- the pattern -------------------------------------------------------------------


def propose(graph: Graph, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Per matmul U = T @ B among ``nodes`` (a partition) whose T is a
    matmul x @ A, and per matmul C = x @ W of the same x that U's value
    (through scalar scales) is added to, directly or after adds: the set of
    the three matmuls, the scales, the adds and the join, alone and with the
    join's aligned elementwise readers.  Weights that are not constants, a
    rank too large, T read elsewhere: judged all the same, so ``explain
    --rejected`` says why."""
    allowed = set(nodes)
    order = graph.position.__getitem__
    out: list[tuple[str, ...]] = []
    for name in nodes:
        up = graph.producer[name]
        if up.op is not Op.MATMUL or up.inputs[0] not in allowed:
            continue
        down = graph.producer[up.inputs[0]]
        if down.op is not Op.MATMUL:
            continue
        x = down.inputs[0]
        v, chain = name, [name]
        while True:  # the scale chain, then the join
            readers = [c for c in graph.consumers.get(v, ()) if c.name in allowed]
            if len(readers) != 1:
                break
            c = readers[0]
            if c.op is Op.ADD:
                core = _core(graph, c, v, x, allowed)
                if core is not None:
                    core |= {down.name, *chain}
                    out.append(tuple(sorted(core, key=order)))
                    grown = _with_epilogue(graph, c, allowed)
                    if grown:
                        out.append(tuple(sorted(core | grown, key=order)))
                break
            if not _scales(graph, c, v):
                break
            chain.append(c.name)
            v = c.name
    return out


def _core(graph: Graph, join: Node, v: str, x: str, allowed: set[str]) -> set[str] | None:
    """The join and the adds back to a matmul of ``x`` on its other side."""
    t = join.inputs[1] if join.inputs[0] == v else join.inputs[0]
    names = {join.name}
    while t in allowed:
        node = graph.producer[t]
        names.add(t)
        if node.op is Op.MATMUL:
            return names if node.inputs[0] == x else None
        if node.op not in (Op.ADD, Op.SUB):
            return None
        t = next(
            (
                i
                for i in node.inputs
                if i in allowed and graph.producer[i].op in (Op.ADD, Op.SUB, Op.MATMUL)
            ),
            "",
        )
    return None


def _with_epilogue(graph: Graph, join: Node, allowed: set[str]) -> set[str]:
    """The join's chain of aligned elementwise readers, each the only reader
    of the one before."""
    names: set[str] = set()
    t, outputs = join.name, set(graph.outputs)
    while t not in outputs:
        readers = graph.consumers.get(t, ())
        if len(readers) != 1:
            break
        c = readers[0]
        if c.name not in allowed or c.op not in ir.ELEMENTWISE or c.shape != join.shape:
            break
        names.add(c.name)
        t = c.name
    return names


def working_set(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """A matmul whose K loop also loads an A tile (BLOCK_K, BLOCK_R), buffered
    ``num_stages`` times when the loop is pipelined (as wgmma's operand tiles
    are; Triton's FMA path buffers it once less for some ranks, once more for
    others), and keeps x @ A's (BLOCK_M, BLOCK_R) fp32 accumulator in
    registers; after the loop the B tile (BLOCK_R, BLOCK_N) in shared memory
    mostly reuses the loop's buffers (sm_90 compiles of 36 configurations,
    ranks 8 to 128, fp16, bf16 and fp32: 1.0x to 1.62x of the compiled figure)."""
    roles, c = spec.roles, spec.config
    assert isinstance(roles, LowRank)
    base = fit.dot_tiles(graph, spec)
    x = graph.types[roles.x]
    it = 2 if x.dtype in HALF else x.itemsize
    bm, bn, bk, br = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], roles.block_r
    tensor_cores = x.dtype in HALF or c.precision == "tf32"
    piped = c.num_stages >= 2 and math.ceil(x.shape[-1] / bk) > 1
    a_tiles = bk * br * it * (c.num_stages if piped else 1)
    # after the loop the B tile, and (FMA path, small BLOCK_K) the result
    # tile's layout conversion beside it: fp32 64 x 64 x 16 at rank 16 had both
    after = br * bn * it + min(bm, 128) * bn * it + a_tiles
    smem = max(base.shared_bytes + a_tiles, after)
    per_thread = 32 * c.num_warps
    if tensor_cores:
        spills = (bm * bn + bm * br) / per_thread >= 128
    else:  # IEEE fp32 FMAs: the A slice and t beside the matmul's own
        spills = (bm * bn + bm * br + (bm + bn + br) * bk) / per_thread >= 128
    return WorkingSet(smem, base.spills or spills)


RULE = Rule(
    NAME,
    "x @ W + alpha (x @ A) @ B (LoRA, low-rank layers) as one matmul over K + r",
    _judges,
    low_rank,
    propose,
    working_set=working_set,
)
