"""Llama / Mistral-style decoder in plain torch (random weights).

Follows the Hugging Face Llama code op for op: RMSNorm written as
``x * rsqrt(mean(x^2) + eps) * w`` (ONNX: Pow, ReduceMean, Add, Sqrt,
Reciprocal, Mul), rotary embeddings from cos/sin tables gathered at the
position ids and applied with ``rotate_half`` (Slice, Neg, Concat), a
SiLU-gated MLP, grouped-query attention whose ``repeat_kv`` is an expand and a
reshape, and a causal mask built inside the model (``tril`` + ``masked_fill``).
With ``sliding_window`` set (Mistral) the mask is built from position
comparisons instead and also hides keys more than a window behind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input, token_inputs


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    vocab: int = 32000
    max_positions: int = 4096
    rope_theta: float = 10000.0
    sliding_window: int | None = None
    eps: float = 1e-6
    batch: int = 1
    seq: int = 128

    def inputs(self) -> tuple[Input, ...]:
        return token_inputs(self.batch, self.seq, self.vocab, mask=False)


class RmsNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, kv_heads, seq, dim) -> (batch, kv_heads * n_rep, seq, dim)."""
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads = c.heads, c.kv_heads
        self.dim = c.hidden // c.heads
        self.q_proj = nn.Linear(c.hidden, c.heads * self.dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(c.heads * self.dim, c.hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k = repeat_kv(k, self.heads // self.kv_heads)
        v = repeat_kv(v, self.heads // self.kv_heads)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.dim)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_norm = RmsNorm(c.hidden, c.eps)
        self.attn = Attention(c)
        self.post_attention_norm = RmsNorm(c.hidden, c.eps)
        self.mlp = Mlp(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.input_norm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_norm(x))


class Llama(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.sliding_window = c.sliding_window
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.layers))
        self.norm = RmsNorm(c.hidden, c.eps)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        dim = c.hidden // c.heads
        inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        freqs = torch.outer(torch.arange(c.max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", angles.cos(), persistent=False)
        self.register_buffer("sin_cached", angles.sin(), persistent=False)

    def causal_mask(self, seq: int) -> torch.Tensor:
        """(1, 1, seq, seq) bool: True where query i may attend to key j."""
        if self.sliding_window is None:
            allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
        else:
            i = torch.arange(seq).unsqueeze(1)
            j = torch.arange(seq).unsqueeze(0)
            allowed = (j <= i) & (i - j < self.sliding_window)
        return allowed[None, None]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        position_ids = torch.arange(seq).unsqueeze(0)
        cos = self.cos_cached[position_ids].unsqueeze(1)  # (1, 1, seq, dim)
        sin = self.sin_cached[position_ids].unsqueeze(1)
        mask = self.causal_mask(seq)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))
