"""The attention rule: ``softmax(scores) @ V`` as one flash-attention kernel.

Enumeration grows connected sets around at most one compute anchor, so it
never builds a kernel holding both matmuls of an attention head.  This rule
(Adopter-style: a pattern matched against the primitive graph) adds those
candidates; the linear program weighs them against the matmul / row-reduce /
matmul triple.  The pattern is what fission makes of torch's attention and of
ONNX Attention (``decompose/reduce.py`` Softmax, ``decompose/linalg.py``):

    S = MATMUL(Q, K)                   m1, the scores [*batch, Lq, Lk]
    X = elementwise nodes of S         scale, additive / where mask, casts, softcap
    M = RMAX(X, last axis, keepdims)   optionally MAX(M, c): ONNX Attention's guard
    E = EXP(SUB(X, M))
    Z = SUM(E, last axis, keepdims)    optionally MAX(Z, c)
    P = DIV(E, Z)                      optionally CASTs and the NaN guard
                                       WHERE(ISNAN(P), 0, P) of transformers' SDPA
    O = MATMUL(P, V)                   m2, the anchor and the only output

Prologue: the elementwise / layout nodes computing Q, K, V and the score
chain's side inputs (head split reshapes and transposes, K's transpose,
rotary embeddings, grouped-query EXPANDs, a mask) join the kernel when the
kernel holds every reader of theirs.  The scores and the probabilities are
never written, so nothing but O may be read outside the kernel.

The rule judges every set with two matmuls (``attention``) and proposes,
per partition, one set per ``P @ V`` that ends the pattern, with the largest
prologue the partition allows (``propose``); ``analyse`` gives the roles of
the nodes, which the spec carries to the cost model and the emitter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from orchestrate import ir
from orchestrate.ir import HALF, Graph, Node, Op
from orchestrate.kernels import fit
from orchestrate.kernels.fit import WorkingSet
from orchestrate.kernels.region import (
    POINTWISE_OPS,
    Region,
    ancestors_within,
    descendants_within,
)
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import (
    ATTENTION,
    AttentionRoles,
    KernelSpec,
    Operand,
    Rejection,
    Target,
    inlined,
    split_k,
)
from orchestrate.templates.attention import config as spaces

DOT_DTYPES = ("float16", "bfloat16", "float32")
MAX_BATCH = 65535  # the batch runs on grid axis 1


def _judges(graph: Graph, r: Region) -> bool:
    return len(r.anchors) == 2 and all(a.op is Op.MATMUL for a in r.anchors)


def attention(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    """The attention kernel running the set, or why it cannot."""
    a = analyse(graph, r)
    if isinstance(a, Rejection):
        return a
    m1, m2 = graph.producer[a.m1], graph.producer[a.m2]
    *_, lq, lk = m1.shape
    d, dv = graph.types[m1.inputs[0]].shape[-1], m2.shape[-1]
    configs = spaces.attention(lq, lk, d, dv, math.prod(m1.shape[:-2]), target.device.sms)
    return accept(graph, RULE, r, m1.shape, a, (), configs, target)


def propose(graph: Graph, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """One set per ``P @ V`` matmul among ``nodes`` (a partition) that ends
    the pattern above, with the largest prologue the partition allows."""
    allowed = set(nodes)
    out = []
    for n in nodes:
        node = graph.producer[n]
        if node.op is not Op.MATMUL:
            continue
        core = _match(graph, node, allowed)
        if core is not None:
            grown = _with_prologue(graph, core, allowed)
            out.append(tuple(sorted(grown, key=graph.position.__getitem__)))
        else:
            near = _near_miss(graph, node, allowed)
            if near is not None:  # judged, so explain --rejected says why not
                out.append(tuple(sorted(near, key=graph.position.__getitem__)))
    return out


def analyse(graph: Graph, r: Region) -> AttentionRoles | Rejection:
    """The roles of the set's nodes in the attention pattern, or why it is none."""
    names, inside = r.names, r.inside
    m1, m2 = r.anchors  # in graph order
    other = next((n for n in names if graph.producer[n].op in (Op.CONV, Op.POOL)), None)
    if other:
        return Rejection(f"{other} ({graph.producer[other].op.value}) cannot join an attention")
    softmax = _softmax(graph, m2, inside)
    if isinstance(softmax, Rejection):
        return softmax
    x, parts, floors = softmax
    down = descendants_within(graph, m1.name, inside)
    if x != m1.name and x not in down:
        return Rejection(f"softmax input {x} does not follow the scores {m1.name}")
    up = ancestors_within(graph, x, inside) | {x}
    scores = [n for n in names if n in down and n in up]
    roles = {m1.name, m2.name, *scores, *parts}
    prologue = [n for n in names if n not in roles]
    reason = (
        _check_scores(graph, m1, m2, x, scores, parts, inside)
        or _check_prologue(graph, prologue, roles, down, inside)
        or _check_outputs(graph, names, m2, inside)
        or _check_types(
            graph, m1, m2, [n for n in (*scores, *parts) if graph.producer[n].op is not Op.ISNAN]
        )
    )
    if reason:
        return Rejection(reason)
    operands = _operands(graph, m1, m2, prologue)
    return AttentionRoles(
        m1.name,
        m2.name,
        tuple(n for n in names if n in scores and n != m1.name),
        x,
        tuple(n for n in names if n in parts),
        *floors[:2],
        tuple((n, operands[n]) for n in prologue),
        floors[2],
    )


def _operands(graph: Graph, m1: Node, m2: Node, prologue: Iterable[str]) -> dict[str, Operand]:
    """What each prologue node computes: part of K or V (evaluated once per
    block of query rows), of Q only (once) or a side input of the score
    chain (once per score)."""
    inside = set(prologue)

    def feeding(t: str) -> set[str]:
        return ancestors_within(graph, t, inside) | {t} if t in inside else set()

    kv = feeding(m1.inputs[1]) | feeding(m2.inputs[1])
    q = feeding(m1.inputs[0])
    return {n: Operand.KV if n in kv else Operand.Q if n in q else Operand.SCORES for n in inside}


# -- the pattern -----------------------------------------------------------------


def _softmax(graph: Graph, m2: Node, inside: set[str]):
    """From m2's first operand back to the softmax input: (x, nodes, (max
    floor, sum floor, whether P is guarded against NaN))."""
    p = m2.inputs[0]
    casts = []  # from m2 backwards: CASTs and at most one NaN guard
    guard = None  # (WHERE, ISNAN) of P = WHERE(ISNAN(P), 0, P)
    while p in inside and graph.producer[p].op in (Op.CAST, Op.WHERE):
        node = graph.producer[p]
        if node.op is Op.WHERE:
            found = _nan_guard(graph, node, inside)
            if isinstance(found, Rejection):
                return found
            if guard is not None:
                return Rejection(f"{p} guards the probabilities against NaN twice")
            guard = (p, found)
            casts.append(p)
            p = node.inputs[2]
            continue
        if graph.types[node.inputs[0]].dtype not in ir.FLOATS:
            return Rejection(f"{p} casts a non-float value into {m2.name}")
        casts.append(p)
        p = node.inputs[0]
    div = graph.producer.get(p) if p in inside else None
    if div is None or div.op is not Op.DIV:
        return Rejection(f"{m2.name}'s first operand is not a softmax (no division)")
    e, z = div.inputs
    exp = graph.producer.get(e) if e in inside else None
    if exp is None or exp.op is not Op.EXP:
        return Rejection(f"{div.name} does not divide an exp")
    sub = graph.producer.get(exp.inputs[0]) if exp.inputs[0] in inside else None
    if sub is None or sub.op is not Op.SUB:
        return Rejection(f"{exp.name} is not the exp of a max-subtracted value")
    x, mx = sub.inputs
    rmax, max_floor = _floored(graph, mx, Op.RMAX, inside)
    rsum, sum_floor = _floored(graph, z, Op.SUM, inside)
    if rmax is None or rmax.inputs[0] != x:
        return Rejection(f"{sub.name} does not subtract the row maximum of {x}")
    if rsum is None or rsum.inputs[0] != e:
        return Rejection(f"{div.name} does not divide by the row sum of {e}")
    rank = len(graph.types[x].shape)
    for r in (rmax, rsum):
        if tuple(r.attrs["axes"]) != (rank - 1,) or not r.attrs["keepdims"]:
            return Rejection(
                f"softmax not over the key axis ({r.name} axes {list(r.attrs['axes'])})"
            )
    if max_floor == -math.inf:
        max_floor = None  # max(m, -inf) changes nothing
    if not all(math.isfinite(f) for f in (max_floor, sum_floor) if f is not None):
        return Rejection(f"softmax guard {mx} / {z} is not a finite floor")
    # every reader of each softmax value (floors: MAX(RMAX, c) between RMAX and SUB)
    readers = {x: {rmax.name, sub.name}, sub.name: {exp.name}, exp.name: {rsum.name, div.name}}
    readers |= _link(rmax.name, mx, sub.name) | _link(rsum.name, z, div.name)
    path = [div.name, *reversed(casts), m2.name]
    readers |= {a: {b} for a, b in zip(path, path[1:])}
    if guard is not None:  # the guarded value is read by the ISNAN too
        where, isnan = guard
        guarded = graph.producer[where].inputs[2]
        readers[guarded] = readers[guarded] | {isnan}
        readers[isnan] = {where}
    for t, want in readers.items():
        got = {c.name for c in graph.consumers.get(t, ())}
        if got != want:
            what = "scores" if t == x else "probabilities" if t in path else "softmax value"
            return Rejection(_read_elsewhere(what, t, got - want, inside))
    parts = [*casts, div.name, exp.name, sub.name, rmax.name, rsum.name]
    parts += [f for f in (mx, z) if f not in parts]
    parts += [guard[1]] if guard else []
    return x, parts, (max_floor, sum_floor, guard is not None)


def _nan_guard(graph: Graph, where: Node, inside: set[str]) -> str | Rejection:
    """The ISNAN of ``where`` = WHERE(ISNAN(p), 0, p), the guard transformers'
    SDPA export puts after the softmax for rows with every key masked."""
    cond, zero, p = where.inputs
    isnan = graph.producer.get(cond) if cond in inside else None
    const = graph.constants.get(zero)
    if isnan is None or isnan.op is not Op.ISNAN or isnan.inputs[0] != p:
        return Rejection(
            f"{where.name} is a where on the probabilities but not WHERE(ISNAN(p), 0, p)"
        )
    if const is None or const.size != 1 or float(const.reshape(())) != 0.0:
        return Rejection(f"{where.name} replaces NaN probabilities by {zero}, not by 0")
    if where.shape != graph.types[p].shape:
        return Rejection(f"{where.name} broadcasts the probabilities {list(where.shape)}")
    return isnan.name


def _link(reduction: str, floored: str, reader: str) -> dict[str, set[str]]:
    if floored == reduction:
        return {reduction: {reader}}
    return {reduction: {floored}, floored: {reader}}


def _floored(graph: Graph, t: str, op: Op, inside: set[str]):
    """``t`` = op(...) or MAX(op(...), c) for a scalar constant c: (node, c)."""
    n = graph.producer.get(t) if t in inside else None
    if n is None:
        return None, None
    if n.op is op:
        return n, None
    if n.op is Op.MAX:
        for r, c in (n.inputs, n.inputs[::-1]):
            const = graph.constants.get(c)
            inner = graph.producer.get(r) if r in inside else None
            if inner is not None and inner.op is op and const is not None and const.size == 1:
                return inner, float(const.reshape(()))
    return None, None


def _check_scores(graph, m1: Node, m2: Node, x: str, scores, parts, inside) -> str | None:
    for n in scores:
        node = graph.producer[n]
        if node.op not in ir.ELEMENTWISE:
            return f"{n} ({node.op.value}) cannot run on the scores"
        if node.shape != m1.shape:
            return f"{n} {list(node.shape)} is not aligned with the scores {list(m1.shape)}"
    if m2.inputs[1] in {m1.name, *scores, *parts}:
        return f"{m2.name} reads V from the scores or probabilities"
    allowed = set(scores) | {p for p in parts if graph.producer[p].inputs[0] == x}
    for n in [m1.name, *scores]:
        readers = {c.name for c in graph.consumers.get(n, ())}
        if n != x and not readers <= allowed:
            return _read_elsewhere("scores", n, readers - allowed, inside)
    return None


def _read_elsewhere(what: str, t: str, readers: set[str], inside: set[str]) -> str:
    where = "the kernel" if readers - inside else "the softmax"
    return f"{what} {t} read outside {where} (by {', '.join(sorted(readers)) or 'nothing'})"


def _check_prologue(graph, prologue, roles, down, inside) -> str | None:
    feeds = set().union(*(ancestors_within(graph, r, inside) for r in roles)) if roles else set()
    for n in prologue:
        node = graph.producer[n]
        if n in down:
            return f"{n} ({node.op.value}) follows the scores but is not part of the softmax"
        if node.op not in POINTWISE_OPS:
            return f"{n} ({node.op.value}) cannot run in an attention prologue"
        if n not in feeds:
            return f"{n} neither feeds nor follows the attention"
    return None


def _check_outputs(graph, names, m2: Node, inside) -> str | None:
    outputs = set(graph.outputs)
    for n in names:
        if n == m2.name:
            continue
        readers = [c.name for c in graph.consumers.get(n, ()) if c.name not in inside]
        if n in outputs or readers:
            return f"{n} is read outside the kernel (only {m2.name} is written)"
    if any(c.name in inside for c in graph.consumers.get(m2.name, ())):
        return f"{m2.name} feeds the kernel's own nodes (attention takes no epilogue)"
    return None


def _check_types(graph, m1: Node, m2: Node, values) -> str | None:
    for n in (m1, m2):
        if any(graph.types[i].dtype not in DOT_DTYPES for i in n.inputs):
            return f"{n.name}: attention runs on float16 / bfloat16 / float32 matmuls only"
    for n in values:
        if graph.types[n].dtype not in DOT_DTYPES:
            return f"{n} is {graph.types[n].dtype}: scores are float16 / bfloat16 / float32 only"
    if m1.shape[:-2] != m2.shape[:-2]:
        return (
            f"batch of the scores {list(m1.shape[:-2])} differs from the output's "
            f"{list(m2.shape[:-2])}"
        )
    if math.prod(m1.shape[:-2]) > MAX_BATCH:
        return f"batch of {math.prod(m1.shape[:-2])} exceeds grid axis 1"
    return None


# -- matching and the prologue ------------------------------------------------------


def _match(graph: Graph, m2: Node, allowed: set[str]) -> set[str] | None:
    """m1, the score chain, the softmax and ``m2`` when m2 ends the pattern."""
    found = _softmax(graph, m2, allowed)
    if isinstance(found, Rejection):
        return None
    x, parts, _ = found
    # the score chain: same-shaped elementwise ancestors of x, back to a matmul
    shape = graph.types[x].shape
    chain, stack, m1s = set(), [x], set()
    while stack:
        t = stack.pop()
        node = graph.producer.get(t)
        if node is None or t not in allowed or t in chain or node.shape != shape:
            continue
        if node.op is Op.MATMUL:
            m1s.add(t)
        elif node.op in ir.ELEMENTWISE:
            chain.add(t)
            stack += node.inputs
    if len(m1s) != 1:
        return None
    m1 = m1s.pop()
    scores = (descendants_within(graph, m1, chain) & chain) | {m1}
    return scores | set(parts) | {m2.name}


def _near_miss(graph: Graph, m2: Node, allowed: set[str]) -> set[str] | None:
    """A matmul whose first operand is computed from another matmul's output
    through elementwise nodes and row reductions including an EXP and a RMAX,
    but is not the pattern: those nodes and both matmuls, which the rule
    then declines with its reason."""
    p = m2.inputs[0]
    shape = graph.types[p].shape
    seen, stack, m1s = set(), [p], set()
    while stack:
        t = stack.pop()
        node = graph.producer.get(t)
        if node is None or t not in allowed or t in seen:
            continue
        if node.op is Op.MATMUL:
            if node.shape == shape:
                m1s.add(t)
            continue
        if node.op not in ir.ELEMENTWISE and node.op not in (Op.RMAX, Op.SUM):
            continue
        seen.add(t)
        stack += node.inputs
    ops = {graph.producer[n].op for n in seen}
    if len(m1s) != 1 or not {Op.EXP, Op.RMAX} <= ops:
        return None
    (m1,) = m1s
    between = descendants_within(graph, m1, seen) & seen
    return between | {m1, m2.name}


def _with_prologue(graph: Graph, core: set[str], allowed: set[str]) -> set[str]:
    """``core`` plus every pointwise producer of its inputs (transitively)
    whose readers are all in the kernel."""
    names = set(core)
    outputs = set(graph.outputs)
    grown = True
    while grown:
        grown = False
        for t in sorted({i for n in names for i in graph.producer[n].inputs} - names):
            p = graph.producer.get(t)
            if p is None or t not in allowed or t in outputs or p.op not in POINTWISE_OPS:
                continue
            if all(c.name in names for c in graph.consumers.get(t, ())):
                names.add(t)
                grown = True
    return names


def working_set(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """The Q, K and probability tiles, a row of fp32 running state, and
    ``S - 1`` more copies of the K, V (and score side input) tiles when the
    key loop is pipelined (``kernels/fit.py`` says how it was calibrated)."""
    c, roles = spec.config, spec.roles
    assert isinstance(roles, AttentionRoles)
    m1, m2 = graph.producer[roles.m1], graph.producer[roles.m2]
    half = m1.dtype in HALF
    it = 2 if half else 4
    bm, bn, bd, bdv = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"]
    stages, warps = c.num_stages, c.num_warps
    prologue = [n for n, _ in roles.prologue]
    k_loads = fit.tile_loads(graph, spec, m1.inputs[1], prologue)
    v_loads = fit.tile_loads(graph, spec, m2.inputs[1], prologue)
    side = [n for n, op in roles.prologue if op is Operand.SCORES] + list(roles.scores)
    s_loads = [
        fit.itemsize(graph, i)
        for n in side
        for i in graph.producer[n].inputs
        if i not in spec.nodes and not inlined(graph, i)
    ]
    with_prologue = len(k_loads) > 1 or len(v_loads) > 1
    looped = (
        sum(k_loads) * bd * bn
        + sum(v_loads) * bn * bdv
        + (sum(s_loads) * bm * bn if with_prologue else 0)
    )
    base = (bm * bd + bn * bd + bm * bn) * it + (0 if half else 4 * bm)
    if stages >= 2 and m1.shape[-1] > bn:  # the key loop is pipelined
        smem = base + (stages - 1) * looped
    else:
        # without pipelining Triton's allocator reuses fp16 buffers unevenly
        # (0.5x to 2x of the tiles between 4 and 8 warps): the safe bound
        smem = base if not half else 2 * base
    per_thread = 32 * warps
    if half:
        spills = bm * (bn + bdv) / per_thread >= 128
    else:
        # IEEE fp32 dots run as FMAs with each key step's products unrolled:
        # from 512 products a thread (BLOCK_M x BLOCK_N x head dim / threads)
        # ptxas spills (sm_90, Triton 3.9: head dim 128 at 32 x 16 tiles and
        # 4 warps 556-656 B, at 32 x 32 and 8 warps 304-412 B; head dim 64 at
        # 16 x 64, 4 warps, 1 stage 524 B); below it none did, masked or not
        # (16 x 16 tiles of head dim 256 at 8 warps, 32 x 16 of 128 at 8: 0 B)
        spills = bm * bn * max(bd, bdv) / per_thread >= 512
    # split-KV's combine holds the output tile beside the SPLIT_K partial
    # tiles it loads (an unrolled loop), as split-K's fix-up does
    splits = split_k(c)
    if splits > 1:
        spills = spills or (splits + 1) * bm * bdv / per_thread >= fit.SPLIT_K_SPILL
        # and converts that fp32 tile's layout through shared memory, beside
        # the pipelined buffers (sm_90, head dim 128 fp16, 64 x 128 tiles,
        # SPLIT_K 2: 212,992 B compiled against 196,608 B without this term)
        smem += bm * bdv * 4
    return WorkingSet(smem, spills)


RULE = Rule(
    ATTENTION,
    "softmax(Q @ K, scaled and masked) @ V as one flash-attention kernel",
    _judges,
    attention,
    propose,
    working_set=working_set,
    covering=("BLOCK_D", "BLOCK_DV"),
)
