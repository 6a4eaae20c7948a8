"""onnxruntime's fused operators (``com.microsoft``), back into primitives.

onnxruntime's transformer optimizer and GenAI's model builder write these in
place of the subgraphs they fuse; fission splits them again, so the planner
sees the same primitives as in the unfused model and fuses them its own way.
The semantics are onnxruntime's contrib-op documentation (``ContribOperators.md``)
and its CPU kernels, against which ``tests/decompose/test_decompose_contrib.py``
checks each one.

``SimplifiedLayerNormalization`` is the one onnxruntime registers in the ONNX
domain (its optimizer writes it there); the others are ``com.microsoft``.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrate.decompose import linalg, normalization
from orchestrate.decompose.builder import Builder, Value
from orchestrate.errors import GraphError, UnsupportedError

MS = "com.microsoft"


def _gelu(b: Builder, x: Value) -> Value:
    return b.mul(b.mul(x, 0.5), b.add(b.erf(b.mul(x, 1 / math.sqrt(2))), 1))


def _tanh_gelu(b: Builder, x: Value) -> Value:
    inner = b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), 0.044715)), math.sqrt(2 / math.pi))
    return b.mul(b.mul(x, 0.5), b.add(b.tanh(inner), 1))


def Gelu(b: Builder, x: Value) -> Value:
    """The erf GELU."""
    return _gelu(b, x)


def BiasGelu(b: Builder, x: Value, bias: Value) -> Value:
    """GELU(x + bias), erf form."""
    return _gelu(b, b.add(x, bias))


def FastGelu(b: Builder, x: Value, bias: Value | None = None) -> Value:
    """The tanh approximation of GELU, of ``x + bias``."""
    return _tanh_gelu(b, x if bias is None else b.add(x, bias))


def QuickGelu(b: Builder, x: Value, *, alpha: float = 1.702) -> Value:
    """``x * sigmoid(alpha * x)``."""
    return b.mul(x, b.sigmoid(b.mul(x, alpha)))


def BiasAdd(b: Builder, x: Value, bias: Value, skip: Value) -> Value:
    """``x + bias + skip``."""
    return b.add(b.add(x, bias), skip)


def FusedMatMul(
    b: Builder,
    a: Value,
    c: Value,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    transBatchA: int = 0,
    transBatchB: int = 0,
) -> Value:
    """``alpha * op(A) @ op(B)``, ``op`` transposing the last two axes."""
    if transBatchA or transBatchB:
        raise UnsupportedError("FusedMatMul with transBatchA or transBatchB", {"FusedMatMul": 1})

    def op(v: Value, trans: int) -> Value:
        if not trans:
            return v
        if v.rank < 2:
            raise GraphError(f"FusedMatMul transposes an operand of rank {v.rank}")
        perm = list(range(v.rank - 2)) + [v.rank - 1, v.rank - 2]
        return b.transpose(v, perm)

    y = linalg.MatMul(b, op(a, transA), op(c, transB))
    return y if alpha == 1.0 else b.mul(y, alpha)


def _skip_sum(b: Builder, x: Value, skip: Value, bias: Value | None) -> Value:
    s = b.add(x, skip)
    return s if bias is None else b.add(s, bias)


def SkipLayerNormalization(
    b: Builder,
    x: Value,
    skip: Value,
    gamma: Value,
    beta: Value | None = None,
    bias: Value | None = None,
    *,
    epsilon: float = 1e-12,
):
    """LayerNorm(x + skip + bias) * gamma + beta over the last axis; outputs
    the result and (fourth) the sum before the norm.  The mean and inverse
    standard deviation outputs are declined when read."""
    s = _skip_sum(b, x, skip, bias)
    y, _, _ = normalization.LayerNormalization(b, s, gamma, beta, axis=-1, epsilon=epsilon)
    return y, None, None, s


def SkipSimplifiedLayerNormalization(
    b: Builder,
    x: Value,
    skip: Value,
    gamma: Value,
    bias: Value | None = None,
    *,
    epsilon: float = 1e-12,
):
    """RMSNorm(x + skip + bias) * gamma over the last axis; the fourth
    output is the sum before the norm."""
    s = _skip_sum(b, x, skip, bias)
    return normalization.RMSNormalization(b, s, gamma, axis=-1, epsilon=epsilon), None, None, s


def RotaryEmbedding(
    b: Builder,
    x: Value,
    position_ids: Value,
    cos_cache: Value,
    sin_cache: Value,
    *,
    interleaved: int = 0,
    is_packed_batching: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
    scale: float = 1.0,
) -> Value:
    """Rotate the first ``rotary_embedding_dim`` features of each head by the
    angles the caches hold at each token's position: halves (``x1 * cos -
    x2 * sin``, ``x2 * cos + x1 * sin``), or pairs when ``interleaved``.
    ``x`` is [B, S, N*H] or [B, N, S, H]; ``position_ids`` [B, S], or [1]
    (the first position, the others following)."""
    if is_packed_batching:
        raise UnsupportedError("RotaryEmbedding with packed batching", {"RotaryEmbedding": 1})
    if x.rank == 3:
        batch, seq, hidden = x.shape
        heads = num_heads or (hidden // (2 * cos_cache.shape[-1]) if cos_cache.rank == 2 else 0)
        if not heads or hidden % heads:
            raise GraphError(f"RotaryEmbedding of {x.shape} needs num_heads dividing {hidden}")
        xs = b.reshape(x, (batch, seq, heads, hidden // heads))  # [B, S, N, H]
        seq_axis = 1
    elif x.rank == 4:
        xs, seq_axis = x, 2  # [B, N, S, H]
        batch, seq = x.shape[0], x.shape[2]
    else:
        raise GraphError(f"RotaryEmbedding of rank {x.rank}")
    head = xs.shape[-1]
    rot = rotary_embedding_dim or head
    half = rot // 2
    if rot % 2 or rot > head or cos_cache.rank != 2 or cos_cache.shape[-1] < half:
        raise GraphError(
            f"RotaryEmbedding: rotary dim {rot} of head {head} with a cache of {cos_cache.shape}"
        )
    if position_ids.shape in ((1,), ()):
        start = b.reshape(position_ids, (1, 1))
        positions = b.add(start, b.constant(np.arange(seq, dtype=position_ids.dtype)[None, :]))
        positions = b.expand(positions, (batch, seq))
    elif position_ids.shape == (batch, seq):
        positions = position_ids
    else:
        raise GraphError(f"RotaryEmbedding position_ids {position_ids.shape} for {x.shape}")

    def angle(cache: Value) -> Value:
        c = b.gather(b.slice_axis(cache, -1, 0, half), positions, 0)  # [B, S, half]
        shape = (batch, seq, 1, half) if seq_axis == 1 else (batch, 1, seq, half)
        return b.reshape(c, shape)

    cos, sin = angle(cos_cache), angle(sin_cache)
    if scale != 1.0:
        xs = b.mul(xs, scale)
    if interleaved:
        pairs = b.reshape(b.slice_axis(xs, -1, 0, rot), xs.shape[:-1] + (half, 2))
        x1 = b.reshape(b.slice_axis(pairs, -1, 0, 1), xs.shape[:-1] + (half,))
        x2 = b.reshape(b.slice_axis(pairs, -1, 1, 2), xs.shape[:-1] + (half,))
    else:
        x1, x2 = b.slice_axis(xs, -1, 0, half), b.slice_axis(xs, -1, half, rot)
    y1 = b.sub(b.mul(x1, cos), b.mul(x2, sin))
    y2 = b.add(b.mul(x2, cos), b.mul(x1, sin))
    if interleaved:
        pair_shape = xs.shape[:-1] + (half, 1)
        y = b.reshape(
            b.concat([b.reshape(y1, pair_shape), b.reshape(y2, pair_shape)], -1),
            xs.shape[:-1] + (rot,),
        )
    else:
        y = b.concat([y1, y2], -1)
    if rot < head:
        y = b.concat([y, b.slice_axis(xs, -1, rot, head)], -1)
    return b.reshape(y, x.shape)


def MultiHeadAttention(
    b: Builder,
    query: Value,
    key: Value | None = None,
    value: Value | None = None,
    bias: Value | None = None,
    key_padding_mask: Value | None = None,
    attention_bias: Value | None = None,
    past_key: Value | None = None,
    past_value: Value | None = None,
    *,
    num_heads: int,
    mask_filter_value: float = -10000.0,
    scale: float | None = None,
    unidirectional: int = 0,
):
    """softmax(Q K^T * scale + attention_bias) V over ``num_heads`` heads, with
    [B, S, N*H] query, key and value and an optional packed q/k/v ``bias``:
    the ONNX Attention's pieces.  Packed, cross-attention-cache and masked
    forms are declined."""
    if key is None or value is None or key.rank != 3 or value.rank != 3 or query.rank != 3:
        raise UnsupportedError(
            "MultiHeadAttention with packed or 4-D query, key or value", {"MultiHeadAttention": 1}
        )
    if key_padding_mask is not None or past_key is not None or past_value is not None:
        raise UnsupportedError(
            "MultiHeadAttention with a key padding mask or a past", {"MultiHeadAttention": 1}
        )
    if bias is not None:
        dq, dk, dv = query.shape[-1], key.shape[-1], value.shape[-1]
        if bias.shape != (dq + dk + dv,):
            raise GraphError(f"MultiHeadAttention bias {bias.shape}, expected {(dq + dk + dv,)}")
        query = b.add(query, b.slice_axis(bias, 0, 0, dq))
        key = b.add(key, b.slice_axis(bias, 0, dq, dq + dk))
        value = b.add(value, b.slice_axis(bias, 0, dq + dk, dq + dk + dv))
    mask = None
    if attention_bias is not None:
        if attention_bias.rank != 4:
            raise GraphError(f"MultiHeadAttention attention_bias of rank {attention_bias.rank}")
        mask = attention_bias
    y = linalg.Attention(
        b,
        query,
        key,
        value,
        mask,
        q_num_heads=num_heads,
        kv_num_heads=num_heads,
        scale=scale,
        is_causal=int(bool(unidirectional)),
    )
    return y[0] if isinstance(y, tuple) else y


def _split_heads(b: Builder, x: Value, heads: int) -> Value:
    """[B, S, N*H] -> [B, N, S, H]."""
    batch, seq, hidden = x.shape
    if hidden % heads:
        raise GraphError(f"a hidden size of {hidden} is not {heads} heads")
    return b.transpose(b.reshape(x, (batch, seq, heads, hidden // heads)), (0, 2, 1, 3))


def _mask_bias(b: Builder, mask: Value, batch: int, seq: int, total: int, fill: float, like):
    """The additive mask onnxruntime makes of ``mask_index``: 0 where a key is
    attended, ``fill`` where not; [B, 1, S or 1, T]."""
    zero, masked = b.scalar(0.0, like), b.scalar(fill, like)
    if mask.shape == (batch,):  # the keys past each row's length are masked
        keys = b.constant(np.arange(total, dtype=mask.dtype)[None, :])
        attend = b.lt(keys, b.reshape(mask, (batch, 1)))
        return b.reshape(b.where(attend, zero, masked), (batch, 1, 1, total))
    if mask.shape == (batch, total):
        attend = b.lt(b.scalar(0, mask), mask)
        return b.reshape(b.where(attend, zero, masked), (batch, 1, 1, total))
    if mask.shape == (batch, seq, total):
        attend = b.lt(b.scalar(0, mask), mask)
        return b.reshape(b.where(attend, zero, masked), (batch, 1, seq, total))
    raise UnsupportedError(f"Attention mask_index of shape {mask.shape}", {"Attention mask": 1})


def Attention(
    b: Builder,
    x: Value,
    weights: Value,
    bias: Value | None = None,
    mask_index: Value | None = None,
    past: Value | None = None,
    attention_bias: Value | None = None,
    past_sequence_length: Value | None = None,
    *,
    num_heads: int,
    qkv_hidden_sizes: list[int] | None = None,
    unidirectional: int = 0,
    mask_filter_value: float = -10000.0,
    scale: float | None = None,
    do_rotary: int = 0,
    past_present_share_buffer: int = 0,
    rotary_embedding_dim: int = 0,
):
    """onnxruntime's packed attention (what its BERT optimizer writes):
    ``x @ weights + bias`` split into Q, K and V, softmax(Q K^T * scale +
    mask) V over ``num_heads`` heads.  ``mask_index`` as key lengths [B], or
    a 0/1 mask [B, T] or [B, S, T], masked keys getting ``mask_filter_value``
    added as onnxruntime does; ``unidirectional`` masks later keys the same
    way.  A past, rotary embedding and the present output are declined."""
    if past is not None or past_sequence_length is not None or do_rotary:
        raise UnsupportedError("Attention with a past or rotary embedding", {"Attention": 1})
    if x.rank != 3 or weights.rank != 2:
        raise GraphError(f"Attention of input {x.shape} and weights {weights.shape}")
    sizes = list(qkv_hidden_sizes or [weights.shape[1] // 3] * 3)
    if len(sizes) != 3 or sum(sizes) != weights.shape[1]:
        raise GraphError(f"Attention qkv_hidden_sizes {sizes} for weights {weights.shape}")
    qkv = b.matmul(x, weights)
    if bias is not None:
        qkv = b.add(qkv, bias)
    ends = np.cumsum([0, *sizes])
    q, k, v = (
        _split_heads(b, b.slice_axis(qkv, -1, int(ends[i]), int(ends[i + 1])), num_heads)
        for i in range(3)
    )
    batch, _, seq, head = q.shape
    s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    s = b.mul(s, scale if scale else 1 / math.sqrt(head))
    if attention_bias is not None:
        s = b.add(s, attention_bias)
    if mask_index is not None:
        s = b.add(s, _mask_bias(b, mask_index, batch, seq, seq, mask_filter_value, s))
    if unidirectional:
        later = np.triu(np.ones((seq, seq), dtype=bool), 1)
        s = b.add(s, b.constant(np.where(later, mask_filter_value, 0).astype(s.dtype)))
    e = b.exp(b.sub(s, b.reduce_max(s, [-1])))
    p = b.div(e, b.sum(e, [-1]))
    y = b.transpose(b.matmul(p, v), (0, 2, 1, 3))
    return b.reshape(y, (batch, seq, num_heads * v.shape[-1])), None


OPS = {
    f"{MS}::Attention": Attention,
    f"{MS}::Gelu": Gelu,
    f"{MS}::BiasGelu": BiasGelu,
    f"{MS}::FastGelu": FastGelu,
    f"{MS}::QuickGelu": QuickGelu,
    f"{MS}::BiasAdd": BiasAdd,
    f"{MS}::FusedMatMul": FusedMatMul,
    f"{MS}::SkipLayerNormalization": SkipLayerNormalization,
    f"{MS}::SkipSimplifiedLayerNormalization": SkipSimplifiedLayerNormalization,
    f"{MS}::RotaryEmbedding": RotaryEmbedding,
    f"{MS}::MultiHeadAttention": MultiHeadAttention,
    # onnxruntime's name for RMSNormalization over axes [axis, rank)
    "SimplifiedLayerNormalization": normalization.RMSNormalization,
}
