"""The decode-step model of ``examples/decode.py``, in plain torch (random
weights): Llama-, Qwen2- and GPT-2-style, one new token and the key/value
cache of the earlier ones in, the next token's logits and the grown cache
out. Its own module, so that the package's ``EXAMPLES`` registry can hold it
while ``python -m examples.decode`` runs the exporter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input

STYLES = ("llama", "qwen2", "gpt2")
INPUTS = ("input_ids", "attention_mask", "past_k", "past_v")
OUTPUTS = ("logits", "present_k", "present_v")


@dataclass(frozen=True)
class DecodeConfig:
    style: str = "llama"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 128
    max_positions: int = 4096
    eps: float = 1e-5
    past: int = 8  # the cached tokens of the example inputs (``examples.EXAMPLES``)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def inputs(self) -> tuple[Input, ...]:
        """The step at ``past`` cached tokens, with fixed shapes (the
        ``decode`` example; ``export_decode`` makes the past dynamic)."""
        cache = (self.layers, 1, self.kv_heads, self.past, self.head_dim)
        return (
            Input("input_ids", (1, 1), "int64", high=self.vocab),
            Input("attention_mask", (1, self.past + 1), "int64", high=2),
            Input("past_k", cache),
            Input("past_v", cache),
        )

    @property
    def rope(self) -> bool:
        return self.style != "gpt2"


def config(style: str) -> DecodeConfig:
    """The tiny example of a style; GPT-2 has as many key/value heads as heads."""
    if style not in STYLES:
        raise ValueError(f"{style}: expected one of {', '.join(STYLES)}")
    return DecodeConfig(style=style, kv_heads=4 if style == "gpt2" else 2)


# the benchmark's decode step: the suite's wide Llama-style decoder (four
# layers at width 2048, head dim 128, four query heads per key/value head)
# at 512 cached tokens
WIDE = DecodeConfig(
    layers=4, hidden=2048, heads=16, kv_heads=4, intermediate=5632, vocab=32000, past=512
)


class RmsNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _norm(c: DecodeConfig) -> nn.Module:
    return nn.LayerNorm(c.hidden, eps=c.eps) if c.style == "gpt2" else RmsNorm(c.hidden, c.eps)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: DecodeConfig):
        super().__init__()
        self.c = c
        bias = c.style != "llama"  # Qwen2's q/k/v biases; GPT-2's everywhere
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=bias)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=bias)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=bias)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=c.style == "gpt2")

    def forward(self, x, cos, sin, past_k, past_v, hide):
        c = self.c
        q = self.q(x).view(1, 1, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(x).view(1, 1, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(x).view(1, 1, c.kv_heads, c.head_dim).transpose(1, 2)
        if c.rope:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        keys = torch.cat((past_k, k), dim=2)  # [1, kv_heads, past + 1, head_dim]
        values = torch.cat((past_v, v), dim=2)
        rep = c.heads // c.kv_heads
        q = q.view(1, c.kv_heads, rep, c.head_dim)  # the query heads sharing a key head
        scores = q @ keys.transpose(2, 3) / math.sqrt(c.head_dim) + hide
        out = F.softmax(scores, dim=-1) @ values  # [1, kv_heads, rep, head_dim]
        return self.o(out.reshape(1, 1, c.hidden)), keys, values

    def prefill(self, x, cos, sin, past_k, past_v, hide):
        """``forward`` for ``seq`` new tokens at once: x [1, seq, hidden],
        ``hide`` [1, 1, seq, past + seq] (the mask and causality)."""
        c = self.c
        seq = x.shape[1]
        q = self.q(x).view(1, seq, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(x).view(1, seq, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(x).view(1, seq, c.kv_heads, c.head_dim).transpose(1, 2)
        if c.rope:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        keys = torch.cat((past_k, k), dim=2)  # [1, kv_heads, past + seq, head_dim]
        values = torch.cat((past_v, v), dim=2)
        rep = c.heads // c.kv_heads
        shared_k = torch.repeat_interleave(keys, rep, dim=1)  # a key head per query head
        shared_v = torch.repeat_interleave(values, rep, dim=1)
        scores = q @ shared_k.transpose(2, 3) / math.sqrt(c.head_dim) + hide
        out = F.softmax(scores, dim=-1) @ shared_v  # [1, heads, seq, head_dim]
        return self.o(out.transpose(1, 2).reshape(1, seq, c.hidden)), keys, values


class Mlp(nn.Module):
    def __init__(self, c: DecodeConfig):
        super().__init__()
        self.gpt2 = c.style == "gpt2"
        if self.gpt2:
            self.up = nn.Linear(c.hidden, c.intermediate)
            self.down = nn.Linear(c.intermediate, c.hidden)
        else:
            self.gate = nn.Linear(c.hidden, c.intermediate, bias=False)
            self.up = nn.Linear(c.hidden, c.intermediate, bias=False)
            self.down = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x):
        if self.gpt2:
            return self.down(F.gelu(self.up(x), approximate="tanh"))
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, c: DecodeConfig):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = _norm(c), Attention(c), _norm(c), Mlp(c)

    def forward(self, x, cos, sin, past_k, past_v, hide, prefill: bool = False):
        attend = self.attn.prefill if prefill else self.attn
        a, keys, values = attend(self.norm1(x), cos, sin, past_k, past_v, hide)
        x = x + a
        return x + self.mlp(self.norm2(x)), keys, values


class DecodeStep(nn.Module):
    OUTPUTS = OUTPUTS

    def __init__(self, c: DecodeConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.norm = _norm(c)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.rope:
            d = c.head_dim
            inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
            angles = torch.outer(torch.arange(c.max_positions, dtype=torch.float32), inv)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos_table", angles.cos(), persistent=False)
            self.register_buffer("sin_table", angles.sin(), persistent=False)
        else:
            self.positions = nn.Embedding(c.max_positions, c.hidden)

    def forward(self, input_ids, attention_mask, past_k, past_v):
        position = attention_mask.sum(-1, keepdim=True) - 1  # [1, 1]
        x = self.embed(input_ids)
        # [1, 1, 1, past + 1]: 0 where attended, the dtype's least value where
        # masked (a where, not a product: 0 x -inf would be NaN in half precision)
        attended = attention_mask[:, None, None, :] > 0
        hide = torch.where(attended, 0.0, torch.finfo(x.dtype).min).to(x.dtype)
        return self.through(x, position, hide, past_k, past_v, prefill=False)

    def through(self, x, position, hide, past_k, past_v, prefill: bool):
        """The embedded tokens ``x`` at ``position`` through the layers and
        the head: the logits and the grown caches."""
        cos = sin = None
        if self.c.rope:
            cos, sin = self.cos_table[position][:, None], self.sin_table[position][:, None]
        else:
            x = x + self.positions(position)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, past_k[i], past_v[i], hide, prefill)
            keys.append(k)
            values.append(v)
        return self.lm_head(self.norm(x)), torch.stack(keys), torch.stack(values)


class PrefillStep(DecodeStep):
    """The decode step's model run over ``seq`` new tokens at once (a
    prompt): input_ids [1, seq], attention_mask [1, past + seq], the caches
    as the decode step's; logits [1, seq, vocab] and the caches grown by
    ``seq`` rows. Token ``i`` attends to the unmasked slots of the cache and
    to the new tokens up to itself; positions count the mask's ones."""

    def forward(self, input_ids, attention_mask, past_k, past_v):
        seq = input_ids.shape[1]
        slots = attention_mask.shape[1]
        position = (attention_mask.cumsum(-1) - 1)[:, slots - seq :]  # [1, seq]
        x = self.embed(input_ids)
        key = torch.arange(slots)[None, :]
        query = torch.arange(slots - seq, slots)[:, None]
        attended = (attention_mask[:, None, None, :] > 0) & (key <= query)[None, None]
        hide = torch.where(attended, 0.0, torch.finfo(x.dtype).min).to(x.dtype)
        return self.through(x, position, hide, past_k, past_v, prefill=True)


def model(style: str, seed: int = 0) -> DecodeStep:
    torch.manual_seed(seed)
    return DecodeStep(config(style)).eval()


def example_inputs(c: DecodeConfig, past: int) -> tuple[torch.Tensor, ...]:
    """A step at ``past`` earlier tokens, every slot attended."""
    g = torch.Generator().manual_seed(past)
    cache = (c.layers, 1, c.kv_heads, past, c.head_dim)
    return (
        torch.randint(0, c.vocab, (1, 1), generator=g),
        torch.ones(1, past + 1, dtype=torch.int64),
        torch.randn(cache, generator=g),
        torch.randn(cache, generator=g),
    )
