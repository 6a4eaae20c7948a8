"""Linear-algebra ONNX operators: MatMul, Gemm, Einsum and Attention.

All of them end in the batched MATMUL primitive (rank >= 2 operands, numpy
broadcasting of the batch axes) with layout and elementwise primitives around
it.  Attention in particular is written out as its pieces (Q and K each
scaled by sqrt(scale) as the spec does, matmul, softcap, mask as ADD / WHERE,
softmax as reduce_max / sub / exp / sum / div, matmul) so the planner sees,
and fuses, every one of them.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from orchestrate import ir
from orchestrate.decompose.builder import Builder, Value, onnx_dtype_name
from orchestrate.errors import UnsupportedError

# -- MatMul and Gemm ------------------------------------------------------------


def MatMul(b: Builder, a: Value, c: Value) -> Value:
    """numpy.matmul: a 1-D operand gets a unit axis that is dropped again."""
    if a.rank == 0 or c.rank == 0:
        raise UnsupportedError("MatMul of a scalar", {"MatMul scalar": 1})
    a2 = b.reshape(a, (1,) + a.shape) if a.rank == 1 else a
    c2 = b.reshape(c, c.shape + (1,)) if c.rank == 1 else c
    if a2.shape[-1] != c2.shape[-2]:
        raise UnsupportedError(f"MatMul of {a.shape} and {c.shape}", {"MatMul shapes": 1})
    y = b.matmul(a2, c2)
    shape = y.shape
    if a.rank == 1:
        shape = shape[:-2] + shape[-1:]
    if c.rank == 1:
        shape = shape[:-1]
    return b.reshape(y, shape)


def Gemm(
    b: Builder,
    a: Value,
    c: Value,
    bias: Value | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    broadcast: int = 0,
) -> Value:
    """alpha * A' @ B' + beta * C, with C broadcast to the result (no Gemm primitive)."""
    if a.rank != 2 or c.rank != 2:
        raise UnsupportedError(f"Gemm of {a.shape} and {c.shape}", {"Gemm rank": 1})
    if a.dtype in ir.INTS and (alpha != int(alpha) or beta != int(beta)):
        raise UnsupportedError(f"Gemm on {a.dtype} with alpha={alpha}, beta={beta}", {"Gemm": 1})
    if transA:
        a = b.transpose(a, (1, 0))
    if transB:
        c = b.transpose(c, (1, 0))
    if a.shape[1] != c.shape[0]:
        raise UnsupportedError(f"Gemm of {a.shape} and {c.shape}", {"Gemm shapes": 1})
    y = b.matmul(a, c)
    if alpha != 1.0:
        y = b.mul(y, alpha)
    if bias is None or beta == 0.0:
        return y
    out = y.shape
    if bias.rank > 2 or any(d not in (1, o) for d, o in zip(bias.shape[::-1], out[::-1])):
        raise UnsupportedError(f"Gemm: C of shape {bias.shape} for {out}", {"Gemm C": 1})
    if beta != 1.0:
        bias = b.mul(bias, beta)
    return b.add(y, bias)


# -- Einsum -------------------------------------------------------------------------


def _einsum_terms(equation: str, xs: tuple[Value, ...]) -> tuple[list[list[str]], list[str]]:
    """Each operand's axis labels and the output's; '...' becomes one label per axis."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        raise UnsupportedError(f"Einsum {equation!r} for {len(xs)} inputs", {"Einsum": 1})
    ell_rank = 0
    for t, x in zip(terms, xs):
        if "..." in t:
            ell_rank = max(ell_rank, x.rank - len(t.replace("...", "")))
    ell = [f"...{k}" for k in range(ell_rank)]  # never a letter

    def parse(t: str, rank: int | None) -> list[str]:
        head, dots, tail = t.partition("...")
        if not all(ch.isascii() and ch.isalpha() for ch in head + tail):
            raise UnsupportedError(f"Einsum {equation!r}", {"Einsum equation": 1})
        if not dots:
            return list(t)
        n = ell_rank if rank is None else rank - len(head) - len(tail)
        if n < 0:
            raise UnsupportedError(f"Einsum {equation!r}", {"Einsum equation": 1})
        return list(head) + ell[ell_rank - n :] + list(tail)

    labels = [parse(t, x.rank) for t, x in zip(terms, xs)]
    for lab, x in zip(labels, xs):
        if len(lab) != x.rank:
            raise UnsupportedError(f"Einsum {equation!r} for rank {x.rank}", {"Einsum": 1})
    if arrow:
        out = parse(rhs, None)
    else:
        counts = Counter(c for lab in labels for c in lab if not c.startswith("..."))
        out = ell + sorted(c for c, k in counts.items() if k == 1)
    if len(set(out)) != len(out) or any(all(c not in lab for lab in labels) for c in out):
        raise UnsupportedError(f"Einsum {equation!r}", {"Einsum equation": 1})
    return labels, out


def _diagonal(b: Builder, x: Value, lab: list[str]) -> tuple[Value, list[str]]:
    """Take the diagonal of every label repeated within one operand."""
    while len(set(lab)) != len(lab):
        c = next(c for c in lab if lab.count(c) > 1)
        i, j = [k for k, v in enumerate(lab) if v == c][:2]
        n = x.shape[i]
        if x.shape[j] != n:
            raise UnsupportedError(f"Einsum diagonal of sizes {n} and {x.shape[j]}", {"Einsum": 1})
        rest = [k for k in range(x.rank) if k not in (i, j)]
        x = b.transpose(x, rest + [i, j])
        x = b.reshape(x, x.shape[:-2] + (n * n,))
        x = b.slice(x, [0] * x.rank, [1] * (x.rank - 1) + [n + 1], x.shape[:-1] + (n,))
        lab = [lab[k] for k in rest] + [c]
    return x, lab


def _sum_out(b: Builder, x: Value, lab: list[str], keep) -> tuple[Value, list[str]]:
    """Sum over the labels not in ``keep`` (a unit axis is only reshaped away)."""
    axes = [k for k, c in enumerate(lab) if c not in keep]
    kept = [c for c in lab if c in keep]
    if all(x.shape[k] == 1 for k in axes):
        return b.reshape(x, tuple(d for c, d in zip(lab, x.shape) if c in keep)), kept
    return b.sum(x, axes, keepdims=False), kept


def _arrange(b: Builder, x: Value, lab: list[str], order: list[str]) -> Value:
    """``x`` with axes in ``order``; labels it lacks become unit axes."""
    present = [c for c in order if c in lab]
    x = b.transpose(x, [lab.index(c) for c in present])
    sizes = dict(zip(present, x.shape))
    return b.reshape(x, tuple(sizes.get(c, 1) for c in order))


def Einsum(b: Builder, *xs: Value, equation: str) -> Value:
    """One- and two-operand Einsum as TRANSPOSE / RESHAPE / SUM / MATMUL (or MUL)."""
    if len(xs) not in (1, 2):
        raise UnsupportedError(f"Einsum of {len(xs)} operands", {"Einsum operands": 1})
    labels, out = _einsum_terms(equation, xs)
    if len(xs) == 1:
        x, lab = _diagonal(b, xs[0], labels[0])
        x, lab = _sum_out(b, x, lab, set(out))
        y = b.transpose(x, [lab.index(c) for c in out])
        return y if y is not xs[0] else b.identity(y)
    (x, lx), (y, ly) = (_diagonal(b, v, lab) for v, lab in zip(xs, labels))
    x, lx = _sum_out(b, x, lx, set(out) | set(ly))
    y, ly = _sum_out(b, y, ly, set(out) | set(lx))
    for c in [c for c in lx if c in ly and c not in out]:
        if x.shape[lx.index(c)] != y.shape[ly.index(c)]:  # (n, 1): sum each side alone
            x, lx = _sum_out(b, x, lx, set(lx) - {c})
            y, ly = _sum_out(b, y, ly, set(ly) - {c})
    size = {}
    for v, lab in ((x, lx), (y, ly)):
        for c, d in zip(lab, v.shape):
            if size.get(c, 1) not in (1, d) and d != 1:
                raise UnsupportedError(f"Einsum {equation!r}: sizes of {c!r} differ", {"Einsum": 1})
            size[c] = max(size.get(c, 1), d)
    batch = [c for c in out if c in lx and c in ly]
    left = [c for c in out if c in lx and c not in ly]
    right = [c for c in out if c in ly and c not in lx]
    inner = [c for c in lx if c in ly and c not in out]
    order = batch + left + right
    if not inner:  # an outer product: broadcasting multiply
        prod = b.mul(_arrange(b, x, lx, order), _arrange(b, y, ly, order))
        return b.transpose(prod, [order.index(c) for c in out])
    m = math.prod(size[c] for c in left)
    k = math.prod(size[c] for c in inner)
    n = math.prod(size[c] for c in right)
    xb = _arrange(b, x, lx, batch + left + inner)
    yb = _arrange(b, y, ly, batch + inner + right)
    xb = b.reshape(xb, xb.shape[: len(batch)] + (m, k))
    yb = b.reshape(yb, yb.shape[: len(batch)] + (k, n))
    z = b.matmul(xb, yb)
    z = b.reshape(z, z.shape[: len(batch)] + tuple(size[c] for c in left + right))
    return b.transpose(z, [order.index(c) for c in out])


# -- Attention ------------------------------------------------------------------------


def _heads(b: Builder, x: Value, heads: int | None, what: str) -> Value:
    """(B, S, H*D) -> (B, H, S, D); 4-D passes through."""
    if x.rank == 4:
        return x
    if x.rank != 3 or not heads or x.shape[2] % heads:
        raise UnsupportedError(
            f"Attention: {what} of shape {x.shape} with {heads} heads", {"Attention shape": 1}
        )
    batch, seq, hidden = x.shape
    x = b.reshape(x, (batch, seq, heads, hidden // heads))
    return b.transpose(x, (0, 2, 1, 3))


def _allowed(b: Builder, q_len: int, kv_len: int, offset, rule) -> Value:
    """A constant [q, kv] bool mask ``rule(key - query - offset)`` (scalar offset)."""
    diff = np.arange(kv_len)[None, :] - np.arange(q_len)[:, None] - offset
    return b.constant(rule(diff))


def _and(b: Builder, m: Value | None, n: Value) -> Value:
    return n if m is None else b.and_(m, n)


def _softmax(b: Builder, s: Value, guard: bool) -> Value:
    """Softmax over the last axis; with ``guard`` a row of only -inf gives zeros."""
    m = b.reduce_max(s, [-1])
    if guard:  # -inf rows: exp(-inf - finite) = 0 and the sum 0 becomes 1
        m = b.max(m, float(np.finfo(s.dtype).min))
    e = b.exp(b.sub(s, m))
    z = b.sum(e, [-1])
    if guard:  # any other row sums to at least exp(0) = 1
        z = b.max(z, 1.0)
    return b.div(e, z)


def Attention(
    b: Builder,
    q: Value,
    k: Value,
    v: Value,
    attn_mask: Value | None = None,
    past_key: Value | None = None,
    past_value: Value | None = None,
    nonpad_kv_seqlen: Value | None = None,
    *,
    is_causal: int = 0,
    kv_num_heads: int | None = None,
    q_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    left_window_size: int = -1,
    right_window_size: int = -1,
) -> tuple[Value, Value, Value, Value]:
    """ONNX Attention (opset 23+): softmax(mask(softcap(scale * Q @ K^T))) @ V."""
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise UnsupportedError(
            f"Attention: Q, K, V of shapes {q.shape}, {k.shape}, {v.shape}", {"Attention shape": 1}
        )
    if (past_key is None) != (past_value is None):
        raise UnsupportedError("Attention: past_key without past_value", {"Attention past": 1})
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise UnsupportedError(
            "Attention: nonpad_kv_seqlen with past_key", {"Attention nonpad_kv_seqlen": 1}
        )
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise UnsupportedError(
            f"Attention: qk_matmul_output_mode={qk_matmul_output_mode}", {"Attention mode": 1}
        )
    if min(left_window_size, right_window_size) < -1:
        raise UnsupportedError("Attention: window size below -1", {"Attention window": 1})
    dtype = q.dtype
    three_d = q.rank == 3
    q = _heads(b, q, q_num_heads, "Q")
    k = _heads(b, k, kv_num_heads, "K")
    v = _heads(b, v, kv_num_heads, "V")
    batch, hq, q_len, head = q.shape
    hkv = k.shape[1]
    if k.shape[0] != batch or v.shape[:3] != k.shape[:3] or k.shape[3] != head:
        raise UnsupportedError(
            f"Attention: Q, K, V of shapes {q.shape}, {k.shape}, {v.shape}", {"Attention shape": 1}
        )
    if past_key is not None:
        want_k = (batch, hkv, past_key.shape[2], head)
        if past_key.shape != want_k or past_value.shape != want_k[:3] + v.shape[3:]:
            raise UnsupportedError(
                f"Attention: past_key {past_key.shape} and past_value {past_value.shape} "
                f"for K {k.shape} and V {v.shape}",
                {"Attention past": 1},
            )
        k = b.concat([past_key, k], axis=2)
        v = b.concat([past_value, v], axis=2)
    present_key, present_value = k, v
    past = past_key.shape[2] if past_key is not None else 0
    kv_len = k.shape[2]

    # Q and K are each scaled by sqrt(scale), as the spec does to keep
    # float16 scores from overflowing (and as its reference rounds)
    if scale is None:
        scale = 1.0 / math.sqrt(head)
    if scale != 1.0:
        q = b.mul(q, math.sqrt(scale))
        k = b.mul(k, math.sqrt(scale))
    # grouped-query attention: each kv head serves hq / hkv consecutive q heads
    if hq != hkv:
        if hq % hkv:
            raise UnsupportedError(f"Attention: {hq} q heads, {hkv} kv heads", {"Attention": 1})
        k, v = (_repeat_heads(b, t, hq // hkv) for t in (k, v))
    s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    qk_raw = s
    if softcap > 0:
        s = b.mul(b.tanh(b.div(s, softcap)), softcap)
    qk_capped = s

    # masking: an additive float mask, then -inf where any bool rule says no
    allowed: Value | None = None
    additive: Value | None = None
    if attn_mask is not None:
        _check_mask(attn_mask, (batch, hq, q_len, kv_len))
        if attn_mask.shape[-1] < kv_len:  # short masks are padded to the total length
            pad = [0] * (2 * attn_mask.rank)
            pad[-1] = kv_len - attn_mask.shape[-1]
            fill = 0.0 if attn_mask.dtype == "bool" else float("-inf")
            attn_mask = b.pad(attn_mask, pad, value=fill)
        if attn_mask.dtype == "bool":
            allowed = attn_mask
        else:
            additive = b.cast(attn_mask, s.dtype)
    if nonpad_kv_seqlen is not None:
        lens = b.reshape(b.cast(nonpad_kv_seqlen, "int64"), (batch, 1, 1, 1))
        keys = b.constant(np.arange(kv_len, dtype=np.int64).reshape(1, 1, 1, kv_len))
        allowed = _and(b, allowed, b.lt(keys, lens))
        # query i sits at absolute position i + lens - q_len
        rel = np.arange(kv_len)[None, :] - np.arange(q_len)[:, None] + q_len  # j - i + q_len
        if is_causal:
            allowed = _and(b, allowed, b.le(b.constant(rel), lens))
        if left_window_size >= 0:  # j >= p - left
            allowed = _and(b, allowed, b.le(lens, b.constant(rel + left_window_size)))
        if right_window_size >= 0:  # j <= p + right
            allowed = _and(b, allowed, b.le(b.constant(rel - right_window_size), lens))
    else:
        if is_causal:
            allowed = _and(b, allowed, _allowed(b, q_len, kv_len, past, lambda d: d <= 0))
        if left_window_size >= 0:
            win = left_window_size
            allowed = _and(b, allowed, _allowed(b, q_len, kv_len, past, lambda d: d >= -win))
        if right_window_size >= 0:
            win = right_window_size
            allowed = _and(b, allowed, _allowed(b, q_len, kv_len, past, lambda d: d <= win))
    if additive is not None:
        s = b.add(s, additive)
    if allowed is not None:
        s = b.where(allowed, s, float("-inf"))
    qk_masked = s

    guard = additive is not None or (
        allowed is not None and (allowed.const is None or not allowed.const.any(-1).all())
    )
    if softmax_precision is not None:
        s = b.cast(s, _float_dtype(softmax_precision))
    p = b.cast(_softmax(b, s, guard), dtype)
    y = b.matmul(p, v)
    if three_d:
        y = b.transpose(y, (0, 2, 1, 3))
        y = b.reshape(y, (batch, q_len, hq * y.shape[3]))
    qk = (qk_raw, qk_capped, qk_masked, p)[qk_matmul_output_mode]
    return y, present_key, present_value, qk


def _check_mask(mask: Value, scores: tuple[int, ...]) -> None:
    """The mask must broadcast to the scores (its last axis may be shorter)."""
    shape = mask.shape
    fits = 1 <= mask.rank <= 4 and 1 <= shape[-1] <= scores[-1]
    fits = fits and all(d in (1, s) for d, s in zip(shape[-2::-1], scores[-2::-1]))
    if not fits:
        raise UnsupportedError(
            f"Attention: attn_mask of shape {shape} for scores {scores}", {"Attention mask": 1}
        )


def _repeat_heads(b: Builder, t: Value, reps: int) -> Value:
    """(B, H, S, D) -> (B, H * reps, S, D) with each head repeated in place."""
    batch, heads, seq, dim = t.shape
    t = b.reshape(t, (batch, heads, 1, seq, dim))
    t = b.expand(t, (batch, heads, reps, seq, dim))
    return b.reshape(t, (batch, heads * reps, seq, dim))


def _float_dtype(onnx_type: int) -> str:
    name = onnx_dtype_name(onnx_type)
    if name not in ir.FLOATS:
        raise UnsupportedError(
            f"Attention: softmax_precision {name}", {"Attention.softmax_precision": 1}
        )
    return name


OPS = {"MatMul": MatMul, "Gemm": Gemm, "Einsum": Einsum, "Attention": Attention}
