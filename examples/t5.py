"""T5-style encoder in plain torch (random weights).

As in the Hugging Face T5 code: T5LayerNorm scales by the root mean square
without subtracting the mean and has no bias; attention scores are not scaled
by 1/sqrt(d); the first layer owns a relative position bias table, gathered at
bucketed relative positions computed inside the model (log-spaced buckets
beyond ``buckets // 4`` in each direction) and shared by all layers; the feed
forward is Linear, ReLU, Linear without biases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from examples.export import Input, token_inputs


@dataclass(frozen=True)
class T5Config:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    head_dim: int = 64
    intermediate: int = 3072
    vocab: int = 32128
    buckets: int = 32
    max_distance: int = 128
    eps: float = 1e-6
    batch: int = 1
    seq: int = 128

    def inputs(self) -> tuple[Input, ...]:
        return token_inputs(self.batch, self.seq, self.vocab, mask=True)


class T5LayerNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def relative_buckets(relative: torch.Tensor, buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bidirectional bucketing of ``key - query`` positions."""
    buckets //= 2
    out = (relative > 0).to(torch.long) * buckets
    relative = torch.abs(relative)
    exact = buckets // 2
    is_small = relative < exact
    large = exact + (
        torch.log(relative.float() / exact) / math.log(max_distance / exact) * (buckets - exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return out + torch.where(is_small, relative, large)


class T5Attention(nn.Module):
    def __init__(self, c: T5Config, has_bias: bool):
        super().__init__()
        self.heads, self.head_dim = c.heads, c.head_dim
        inner = c.heads * c.head_dim
        self.q = nn.Linear(c.hidden, inner, bias=False)
        self.k = nn.Linear(c.hidden, inner, bias=False)
        self.v = nn.Linear(c.hidden, inner, bias=False)
        self.o = nn.Linear(inner, c.hidden, bias=False)
        self.buckets, self.max_distance = c.buckets, c.max_distance
        self.bias = nn.Embedding(c.buckets, c.heads) if has_bias else None

    def position_bias(self, seq: int) -> torch.Tensor:
        """(1, heads, seq, seq) from the bias table."""
        context = torch.arange(seq, dtype=torch.long)[:, None]
        memory = torch.arange(seq, dtype=torch.long)[None, :]
        buckets = relative_buckets(memory - context, self.buckets, self.max_distance)
        return self.bias(buckets).permute([2, 0, 1]).unsqueeze(0)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        scores = heads(self.q(x)) @ heads(self.k(x)).transpose(3, 2) + bias
        probs = scores.float().softmax(dim=-1).type_as(scores)
        return self.o((probs @ heads(self.v(x))).transpose(1, 2).reshape(b, s, -1))


class T5Block(nn.Module):
    def __init__(self, c: T5Config, has_bias: bool):
        super().__init__()
        self.attn_norm = T5LayerNorm(c.hidden, c.eps)
        self.attn = T5Attention(c, has_bias)
        self.ff_norm = T5LayerNorm(c.hidden, c.eps)
        self.wi = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.wo = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), bias)
        return x + self.wo(torch.relu(self.wi(self.ff_norm(x))))


class T5Encoder(nn.Module):
    OUTPUTS = ("last_hidden_state",)

    def __init__(self, c: T5Config):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(T5Block(c, has_bias=k == 0) for k in range(c.layers))
        self.final_norm = T5LayerNorm(c.hidden, c.eps)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        bias = self.blocks[0].attn.position_bias(input_ids.shape[1]) + mask
        for block in self.blocks:
            x = block(x, bias)
        return self.final_norm(x)
