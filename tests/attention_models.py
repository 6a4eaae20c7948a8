"""Small ONNX attention models in the forms exporters write them, for the
attention matrix (``tests/templates/test_attention_matrix.py``).

``model(case)`` builds, with ``onnx.helper``, one attention layer on
graph inputs ``q`` [B, H, L, D], ``k`` and ``v`` [B, Hkv, L, D] (and a
padding ``mask`` [B, L] where the case has one):

    scores = q @ kᵀ, scaled      Mul by a constant, Div by sqrt(D) (BERT, T5
                                 style) or Q and Kᵀ each times sqrt(scale)
                                 (torch's SDPA decomposition, onnxscript)
    masked                       a causal, padding or sliding-window mask, in
                                 the forms below
    P = Softmax(scores)          optionally with the scores upcast to fp32 and
                                 P cast back (transformers' eager fp16 path)
                                 and the NaN guard Where(IsNaN(P), 0, P)
    out = P @ v                  [B, H, L, D]

Grouped-query heads (Hkv < H) reach Q's heads by transformers' repeat_kv
(Unsqueeze, Expand, Reshape) or by broadcasting: Q reshaped to
[B, Hkv, H/Hkv, L, D] against K and V as [B, Hkv, 1, L, D], the result
reshaped back.

Masks (``MASKS``):

``none``
``causal_inf``      Add of a constant [L, L]: 0 on and below the diagonal, -inf above
``causal_min``      Add of a constant [1, 1, L, L] of the dtype's lowest above the
                    diagonal (transformers' eager ``causal_mask``)
``causal_where``    Where(causal bool constant, scores, -inf) (GPT-2's form)
``causal_range``    built in the graph from Shape, Range, Unsqueeze, LessOrEqual
                    and Where(cond, 0, -inf), then Add; folded by the frontend
``padding``         from the input mask (1 keep, 0 pad): (1 - mask) * lowest,
                    Unsqueezed to [B, 1, 1, L] (or [B, 1, 1, 1, L]), then Add (BERT's form)
``padding_causal``  the padding mask And the causal constant, Where(m, 0, -inf),
                    then Add (SDPA's bool mask): with left padding, the first
                    rows hide every key
``sliding``         a causal window of ``WINDOW`` keys as a bool constant,
                    Where(m, 0, -inf), then Add (Mistral's form)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MASKS = (
    "none",
    "causal_inf",
    "causal_min",
    "causal_where",
    "causal_range",
    "padding",
    "padding_causal",
    "sliding",
)
WINDOW = 8
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


@dataclass(frozen=True)
class Case:
    """One attention model.  ``dtype``: ``fp32``, ``fp16`` (an fp32 model
    planned with ``--dtype fp16``) or ``fp16_model`` (the model itself in
    float16: inputs, constants, and the eager upcast around the softmax)."""

    mask: str = "none"
    seq: int = 17
    head_dim: int = 64
    dtype: str = "fp32"
    kv_heads: int = 2  # < HEADS: grouped-query
    gqa: str = "expand"  # or "broadcast"
    scale: str = "mul"  # or "div", "split"
    guard: bool = False
    batch: int = 1
    q_seq: int = 0  # query rows, when not ``seq`` (decoding; masks "none" and "padding")

    @property
    def id(self) -> str:
        parts = [self.mask, f"L{self.seq}", f"d{self.head_dim}", self.dtype]
        if self.kv_heads < HEADS:
            parts.append(f"gqa-{self.gqa}")
        if self.scale != "mul":
            parts.append(f"scale-{self.scale}")
        if self.guard:
            parts.append("guard")
        if self.batch > 1:
            parts.append(f"b{self.batch}")
        if self.q_seq:
            parts.append(f"q{self.q_seq}")
        return "-".join(parts)

    @property
    def float_type(self) -> str:
        return "float16" if self.dtype == "fp16_model" else "float32"

    @property
    def fully_masked_rows(self) -> bool:
        return self.mask == "padding_causal"


HEADS = 2


class _Nodes:
    """Nodes and initializers of the graph being built, with fresh names."""

    def __init__(self, dtype: str):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.dtype = dtype

    def __call__(self, op: str, *inputs: str, **attrs) -> str:
        out = f"{op.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=None) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype or self.dtype), name))
        return name


def _causal(seq: int) -> np.ndarray:
    return np.tril(np.ones((seq, seq), bool))


def _window(seq: int) -> np.ndarray:
    q, k = np.arange(seq)[:, None], np.arange(seq)[None, :]
    return (k <= q) & (q - k < WINDOW)


def _mask(n: _Nodes, case: Case, s: str, rank: int) -> str:
    """``s`` (of ``rank`` dims) with the case's mask applied."""
    L = case.seq
    if case.mask == "none":
        return s
    if case.mask == "causal_inf":
        return n("Add", s, n.const(np.where(_causal(L), 0.0, -np.inf)))
    if case.mask == "causal_min":
        lowest = float(np.finfo(case.float_type).min)
        return n("Add", s, n.const(np.where(_causal(L), 0.0, lowest)[None, None]))
    if case.mask == "causal_where":
        return n("Where", n.const(_causal(L), bool), s, n.const(-np.inf))
    if case.mask == "causal_range":
        length = n("Gather", n("Shape", "q"), n.const(2, np.int64), axis=0)
        pos = n("Range", n.const(0, np.int64), length, n.const(1, np.int64))
        rows = n("Unsqueeze", pos, n.const([1], np.int64))
        cols = n("Unsqueeze", pos, n.const([0], np.int64))
        keep = n("LessOrEqual", cols, rows)
        return n("Add", s, n("Where", keep, n.const(0.0), n.const(-np.inf)))
    heads = list(range(1, rank - 1))  # a padding mask as [B, 1, .., 1, L]
    if case.mask == "padding":
        m = n("Cast", n("Unsqueeze", "mask", n.const(heads, np.int64)), to=ELEM[case.float_type])
        lowest = float(np.finfo(case.float_type).min)
        return n("Add", s, n("Mul", n("Sub", n.const(1.0), m), n.const(lowest)))
    if case.mask == "padding_causal":
        m = n("Cast", n("Unsqueeze", "mask", n.const(heads, np.int64)), to=TensorProto.BOOL)
        keep = n("And", m, n.const(_causal(L), bool))
        return n("Add", s, n("Where", keep, n.const(0.0), n.const(-np.inf)))
    if case.mask == "sliding":
        return n("Add", s, n("Where", n.const(_window(L), bool), n.const(0.0), n.const(-np.inf)))
    raise ValueError(f"unknown mask {case.mask}")


def _shape(n: _Nodes, x: str, shape) -> str:
    return n("Reshape", x, n.const(list(shape), np.int64))


def model(case: Case) -> onnx.ModelProto:
    B, H, Hkv, L, D = case.batch, HEADS, case.kv_heads, case.seq, case.head_dim
    Lq = case.q_seq or L
    groups = H // Hkv
    n = _Nodes(case.float_type)
    q, k, v = "q", "k", "v"
    broadcast = Hkv < H and case.gqa == "broadcast"
    if Hkv < H and case.gqa == "expand":  # transformers' repeat_kv
        k, v = (
            _shape(
                n,
                n(
                    "Expand",
                    n("Unsqueeze", t, n.const([2], np.int64)),
                    n.const([B, Hkv, groups, L, D], np.int64),
                ),
                (B, H, L, D),
            )
            for t in (k, v)
        )
    if broadcast:
        q = _shape(n, q, (B, Hkv, groups, Lq, D))
        k, v = (n("Unsqueeze", t, n.const([2], np.int64)) for t in (k, v))
    kt = n("Transpose", k, perm=[0, 1, 2, 4, 3] if broadcast else [0, 1, 3, 2])
    scale = 1 / math.sqrt(D)
    if case.scale == "split":  # SDPA: Q and Kᵀ each times sqrt(scale)
        q, kt = (n("Mul", t, n.const(math.sqrt(scale))) for t in (q, kt))
    s = n("MatMul", q, kt)
    if case.scale == "mul":
        s = n("Mul", s, n.const(scale))
    elif case.scale == "div":
        s = n("Div", s, n.const(math.sqrt(D)))
    s = _mask(n, case, s, 5 if broadcast else 4)
    if case.dtype == "fp16_model":  # transformers' eager: softmax in fp32, P back in fp16
        s = n("Cast", s, to=TensorProto.FLOAT)
    p = n("Softmax", s, axis=-1)
    if case.dtype == "fp16_model":
        p = n("Cast", p, to=TensorProto.FLOAT16)
    if case.guard:
        p = n("Where", n("IsNaN", p), n.const(0.0), p)
    out = n("MatMul", p, v)
    if broadcast:
        out = _shape(n, out, (B, H, Lq, D))
    n.nodes[-1].output[0] = "out"
    elem = ELEM[case.float_type]
    inputs = [
        helper.make_tensor_value_info("q", elem, (B, H, Lq, D)),
        helper.make_tensor_value_info("k", elem, (B, Hkv, L, D)),
        helper.make_tensor_value_info("v", elem, (B, Hkv, L, D)),
    ]
    if case.mask.startswith("padding"):
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT64, (B, L)))
    g = helper.make_graph(
        n.nodes,
        case.id,
        inputs,
        [helper.make_tensor_value_info("out", elem, (B, H, Lq, D))],
        initializer=n.inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    onnx.checker.check_model(m, full_check=True)
    return m


def inputs(case: Case, seed: int = 0) -> dict[str, np.ndarray]:
    """Random q, k, v (rounded to fp16 for the fp16 cases, so the reference
    sees the values the kernel does) and a padding mask: batch entry 0
    hides its last quarter of keys, entry 1 (left padding) its first quarter."""
    rng = np.random.default_rng(seed)
    B, L, D = case.batch, case.seq, case.head_dim
    shapes = {
        "q": (B, HEADS, case.q_seq or L, D),
        "k": (B, case.kv_heads, L, D),
        "v": (B, case.kv_heads, L, D),
    }
    out = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32)
        if case.dtype != "fp32":
            x = x.astype(np.float16).astype(case.float_type)
        out[name] = x
    if case.mask.startswith("padding"):
        mask = np.ones((B, L), np.int64)
        pad = max(1, L // 4)
        mask[0, L - pad :] = 0
        if B > 1:
            mask[1, :pad] = 0
        out["mask"] = mask
    return out
