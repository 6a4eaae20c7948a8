"""Library kernels: a matmul, a convolution or an attention as one torch call.

Peers of the generated templates in the rule table.  They judge the same
sets as the Triton ``matmul``, ``conv`` and ``attention`` rules, so one node
set can have two specs and the linear program chooses (``templates.match_all``);
``--gemm-backends`` says which may compete.  A library call computes only
what the library computes, so it accepts only sets the call covers whole:

``library_matmul``     one MATMUL, then at most a scale and a bias add:
                       ``out = alpha * (A @ B) + beta * bias`` as
                       ``torch.addmm`` / ``baddbmm`` (cuBLAS).  Nodes that
                       are no scale or bias (an activation, a cast) belong to
                       a generated epilogue kernel after it.
``library_conv``       one CONV, then at most a per-channel bias add, as
                       ``torch.nn.functional.conv1d/2d/3d`` (cuDNN) with its
                       groups, stride, padding and dilation.
``library_attention``  the attention pattern (``templates/attention/rule.py``
                       ``analyse``) without a prologue, as
                       ``scaled_dot_product_attention``: the score chain may
                       scale the scores by constants and then add one mask
                       (or mask with WHERE(cond, s, fill), either way round,
                       fill -inf, or very negative for a constant mask);
                       casts are free; a constant causal mask becomes
                       ``is_causal``.

Library kernels have no tiles to fit (the library picks its own); a dtype
the library has no kernel for (integer GEMMs: cuBLAS has none torch calls)
is refused with the reason.  The pattern rule here proposes each set the
Triton attention rule proposes, without its prologue (Q, K and V then come
from memory).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from orchestrate import ir
from orchestrate.ir import Graph, Node, Op
from orchestrate.ir.bounds import device_checked
from orchestrate.kernels.region import Region, descendants_within, region
from orchestrate.kernels.rule import Rule
from orchestrate.kernels.spec import (
    LIBRARY_ATTENTION,
    LIBRARY_CONV,
    LIBRARY_MATMUL,
    AttentionRoles,
    KernelSpec,
    LaunchConfig,
    LibraryAttention,
    LibraryCall,
    Rejection,
    Target,
    with_hash,
)
from orchestrate.templates.attention import rule as attention

BACKEND = "library"
# A finite WHERE fill at most this hides a key as -inf does (see _where_mask).
HIDDEN = -1e4
FLOATS = ("float16", "bfloat16", "float32", "float64")  # what cuBLAS / cuDNN / SDPA run


def _scalar(graph: Graph, t: str) -> float | None:
    c = graph.constants.get(t)
    return float(c.reshape(())) if c is not None and c.size == 1 else None


def _chain(graph: Graph, r: Region, anchor: Node, template: str):
    """The nodes after ``anchor`` as one chain (each reads the one before),
    or why the set is not that."""
    after = descendants_within(graph, anchor.name, r.inside)
    if len(after) != len(r.names) - 1:
        first = next(n for n in r.names if n != anchor.name and n not in after)
        return Rejection(
            f"{first} runs before {anchor.name}: a {template} call takes its operands from memory"
        )
    chain, prev = [], anchor.name
    for n in (graph.producer[x] for x in r.names if x in after):
        if prev not in n.inputs:
            return Rejection(
                f"{n.name} does not read {prev}: a {template} call absorbs one "
                "chain of scale and bias nodes"
            )
        if n.shape != anchor.shape or n.dtype != anchor.dtype:
            return Rejection(f"{n.name} {n.type} is not shaped like {anchor.name} {anchor.type}")
        chain.append(n)
        prev = n.name
    for n in [anchor, *chain][:-1]:  # all but the result
        if n.name in r.exposed or n.name in r.sinks:  # (a graph output is a sink)
            return Rejection(
                f"{n.name} is read outside the kernel; a {template} call writes only its result"
            )
    return chain


def _call(
    graph: Graph, r: Region, chain: Sequence[Node], anchor: Node, template: str, scales: bool
) -> LibraryCall | Rejection:
    """alpha and beta of ``out = alpha * anchor + beta * bias`` for the
    chain's scales (MUL / DIV by a scalar constant) and one bias ADD."""
    alpha, beta, bias, prev = 1.0, 0.0, None, anchor.name
    for n in chain:
        other = [i for i in n.inputs if i != prev]
        c = _scalar(graph, other[0]) if len(other) == 1 else None
        if scales and n.op is Op.MUL and c is not None:
            alpha, beta = alpha * c, beta * c
        elif scales and n.op is Op.DIV and c is not None and n.inputs[0] == prev and c != 0:
            alpha, beta = alpha / c, beta / c
        elif (
            n.op is Op.ADD
            and bias is None
            and len(other) == 1
            and c is None
            and (other[0] not in r.inside)
        ):
            bias, beta = other[0], 1.0  # scales before it scaled only the product
            if graph.types[bias].dtype != anchor.dtype:
                return Rejection(f"{n.name} adds {graph.types[bias].dtype} to {anchor.dtype}")
        else:
            what = "a scale or a bias add" if scales else "a bias add"
            return Rejection(f"{n.name} ({n.op.value}) is not {what} a {template} call absorbs")
        prev = n.name
    if bias is None:
        beta = 0.0
    return LibraryCall(anchor.name, tuple(n.name for n in chain), alpha, beta, bias)


def _spec(
    graph: Graph, template: str, r: Region, roles, space, precision: str = "ieee"
) -> KernelSpec:
    """The library spec: no tiles (the library picks them), no optional
    outputs; ``precision``: an fp32 conv's, TF32 under ``--tf32``."""
    return with_hash(
        graph,
        KernelSpec(
            template,
            r.names,
            r.inputs,
            r.sinks,
            (),
            tuple(space),
            roles,
            LaunchConfig(precision=precision),
            device_checked(graph, r.names),
        ),
    )


def _float(graph: Graph, anchor: Node, library: str) -> Rejection | None:
    dtype = graph.types[anchor.inputs[0]].dtype
    if dtype not in FLOATS:
        return Rejection(f"{anchor.name}: {library} has no {dtype} kernel torch calls")
    return None


def library_matmul(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    mm = r.anchors[0]
    refused = _float(graph, mm, "cuBLAS")
    if refused is not None:
        return refused
    chain = _chain(graph, r, mm, LIBRARY_MATMUL)
    if isinstance(chain, Rejection):
        return chain
    call = _call(graph, r, chain, mm, LIBRARY_MATMUL, scales=True)
    if isinstance(call, Rejection):
        return call
    return _spec(graph, LIBRARY_MATMUL, r, call, mm.shape)


def library_conv(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    cv = r.anchors[0]
    refused = _float(graph, cv, "cuDNN")
    if refused is not None:
        return refused
    if len(cv.shape) - 2 not in (1, 2, 3):
        return Rejection(f"{cv.name}: torch has no {len(cv.shape) - 2}-D convolution")
    chain = _chain(graph, r, cv, LIBRARY_CONV)
    if isinstance(chain, Rejection):
        return chain
    call = _call(graph, r, chain, cv, LIBRARY_CONV, scales=False)
    if isinstance(call, Rejection):
        return call
    if call.bias is not None:  # conv's bias: one value per output channel
        shape = graph.types[call.bias].shape
        full = (1,) * (len(cv.shape) - len(shape)) + tuple(shape)
        if any(d != 1 for i, d in enumerate(full) if i != 1):
            return Rejection(
                f"{call.bias} {list(shape)} is not a per-channel bias of {cv.name} {list(cv.shape)}"
            )
    tf32 = target.tf32 and graph.types[cv.inputs[0]].dtype == "float32"
    return _spec(graph, LIBRARY_CONV, r, call, cv.shape, "tf32" if tf32 else "ieee")


def library_attention(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    a = attention.analyse(graph, r)
    if isinstance(a, Rejection):
        return a
    sdpa = sdpa_roles(graph, r, a)
    if isinstance(sdpa, Rejection):
        return sdpa
    return _spec(graph, LIBRARY_ATTENTION, r, sdpa, graph.producer[a.m1].shape)


def sdpa_roles(graph: Graph, r: Region, a: AttentionRoles) -> LibraryAttention | Rejection:
    """The scale and mask of ``softmax(scale * Q @ K + mask) @ V`` in the
    attention's score chain, or why SDPA cannot express it."""
    if a.prologue:
        n = a.prologue[0][0]
        return Rejection(
            f"{n} ({graph.producer[n].op.value}) computes an operand: a "
            "library attention takes Q, K and V from memory"
        )
    if a.max_floor is not None or a.sum_floor is not None:
        return Rejection("the softmax floors its max or sum (max(., c)), which SDPA does not")
    m1, m2 = graph.producer[a.m1], graph.producer[a.m2]
    q, k, v = m1.inputs[0], m1.inputs[1], m2.inputs[1]
    refused = _float(graph, m1, "SDPA")
    if refused is not None:
        return refused
    if not graph.types[q].dtype == graph.types[k].dtype == graph.types[v].dtype == m2.dtype:
        return Rejection(f"{m2.name}: Q, K, V and the output differ in dtype")
    scale, mask, boolean, hides, prev = 1.0, None, False, False, m1.name
    for n in (graph.producer[s] for s in a.scores):
        other = [i for i in n.inputs if i != prev]
        c = _scalar(graph, other[0]) if len(other) == 1 else None
        if n.op is Op.CAST and graph.types[n.inputs[0]].dtype in ir.FLOATS and n.dtype in FLOATS:
            pass  # SDPA keeps its own precision for the scores
        elif n.op is Op.MUL and c is not None and mask is None:
            scale *= c
        elif n.op is Op.DIV and c is not None and n.inputs[0] == prev and mask is None and c:
            scale /= c
        elif n.op is Op.ADD and c is None and len(other) == 1 and mask is None:
            mask = other[0]
        elif n.op is Op.WHERE and mask is None and prev in n.inputs[1:]:
            found = _where_mask(graph, n, prev, m1.shape[-2:])
            if isinstance(found, Rejection):
                return found
            (mask, hides), boolean = found, True
        else:
            return Rejection(
                f"{n.name} ({n.op.value}) on the scores is not a scale before one "
                "mask, which is what SDPA computes"
            )
        prev = n.name
    if mask is not None and mask in r.names:
        return Rejection(f"mask {mask} is computed in the kernel")
    causal = mask is not None and _causal(graph, mask, boolean, hides, m1.shape[-2:])
    return LibraryAttention(m1.name, m2.name, scale, mask, boolean, causal, hides)


def _where_mask(graph: Graph, n: Node, prev: str, scores) -> tuple[str, bool] | Rejection:
    """(mask, whether it marks the hidden keys) of WHERE(mask, s, fill) or
    WHERE(mask, fill, s): a boolean mask SDPA takes.  A fill of -inf is one
    exactly; a finite fill at most ``HIDDEN`` is one too when the mask is a
    constant that leaves every query a key (exp(fill - max) is then 0 in fp32
    and fp64 for scores above fill + 745; a row with every key hidden would
    be uniform, not SDPA's)."""
    cond, hides = n.inputs[0], n.inputs[2] == prev
    fill = _scalar(graph, n.inputs[1] if hides else n.inputs[2])
    if graph.types[cond].dtype != "bool" or fill is None:
        return Rejection(f"{n.name} (where) on the scores is not a mask with a constant fill")
    if fill == -math.inf:
        return cond, hides
    c = graph.constants.get(cond)
    if fill > HIDDEN or c is None:
        what = f"fills {fill:g}" if fill > HIDDEN else "masks with an input and a finite fill"
        return Rejection(f"{n.name} {what}, which is not SDPA's -inf mask")
    kept = np.broadcast_to(c != hides, (*c.shape[:-2], *scores) if c.ndim >= 2 else scores)
    if not kept.any(axis=-1).all():
        return Rejection(
            f"{n.name} hides every key of some query, where its fill {fill:g} "
            "gives a uniform row and SDPA's -inf does not"
        )
    return cond, hides


def _causal(graph: Graph, mask: str, boolean: bool, hides: bool, scores) -> bool:
    """Is ``mask`` a constant hiding exactly the keys after each query (0 or
    True on and below the diagonal, -inf or False above it; the other way
    round for a boolean mask that marks the hidden keys)?"""
    c = graph.constants.get(mask)
    if c is None or c.ndim < 2 or tuple(c.shape[-2:]) != tuple(scores):
        return False
    above = np.triu(np.ones(scores, dtype=bool), 1)
    rows = c.reshape(-1, *scores)
    if boolean:
        return bool((rows == (above if hides else ~above)).all())
    return bool((np.where(above, rows == -np.inf, rows == 0)).all())


def propose(graph: Graph, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """The sets the Triton rule proposes, each without its prologue: the
    set a library attention can run (a near miss as it is, to be declined
    with its reason)."""
    out = []
    for names in attention.propose(graph, nodes):
        r = region(graph, names)
        a = attention.analyse(graph, r) if not isinstance(r, Rejection) else r
        operands = set() if isinstance(a, Rejection) else {n for n, _ in a.prologue}
        out.append(tuple(n for n in names if n not in operands))
    return out


def _one(op: Op):
    def judges(graph: Graph, r: Region) -> bool:
        return len(r.anchors) == 1 and r.anchors[0].op is op and not r.reductions

    return judges


def _two_matmuls(graph: Graph, r: Region) -> bool:
    return len(r.anchors) == 2 and all(a.op is Op.MATMUL for a in r.anchors)


MATMUL_RULE = Rule(
    LIBRARY_MATMUL,
    "torch.addmm / baddbmm (cuBLAS): one matmul, a scale and a bias add",
    _one(Op.MATMUL),
    library_matmul,
    backend=BACKEND,
)
CONV_RULE = Rule(
    LIBRARY_CONV,
    "torch.nn.functional.conv1d/2d/3d (cuDNN): one convolution and its bias",
    _one(Op.CONV),
    library_conv,
    backend=BACKEND,
)
ATTENTION_RULE = Rule(
    LIBRARY_ATTENTION,
    "scaled_dot_product_attention: scaled, masked softmax(Q @ K) @ V",
    _two_matmuls,
    library_attention,
    propose,
    backend=BACKEND,
)
