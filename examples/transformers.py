"""Encoder and decoder transformers with LayerNorm, in plain torch.

Each model follows its Hugging Face original op for op (so the ONNX graph has
the same shape), with random weights and a frozen config dataclass whose
``inputs()`` describes the example inputs.

* :class:`Bert`   - token + position + type embeddings, post-LN encoder,
  additive attention mask from ``attention_mask``, GELU (erf), tanh pooler.
* :class:`Gpt2`   - learned positions, pre-LN decoder, causal mask from a
  lower-triangular buffer with ``torch.where``, GELU (tanh), tied LM head.
* :class:`Vit`    - Conv2d patch embedding, class token, pre-LN encoder using
  ``scaled_dot_product_attention``, classification head.
* :class:`TorchEncoder` - ``nn.TransformerEncoder`` behind a wrapper whose
  forward takes just the tensor (the form the exporters accept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input, token_inputs


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, seq, heads * dim) -> (batch, heads, seq, dim)."""
    b, s, _ = x.shape
    return x.view(b, s, heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, dim) -> (batch, seq, heads * dim)."""
    b, _, s, _ = x.shape
    return x.transpose(1, 2).reshape(b, s, -1)


# ---------------------------------------------------------------- BERT


@dataclass(frozen=True)
class BertConfig:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2
    eps: float = 1e-12
    batch: int = 1
    seq: int = 128

    def inputs(self) -> tuple[Input, ...]:
        return token_inputs(self.batch, self.seq, self.vocab, mask=True)


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.heads
        self.query = nn.Linear(c.hidden, c.hidden)
        self.key = nn.Linear(c.hidden, c.hidden)
        self.value = nn.Linear(c.hidden, c.hidden)
        self.attn_out = nn.Linear(c.hidden, c.hidden)
        self.attn_norm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.intermediate = nn.Linear(c.hidden, c.intermediate)
        self.output = nn.Linear(c.intermediate, c.hidden)
        self.out_norm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.query(x), self.heads)
        k = split_heads(self.key(x), self.heads)
        v = split_heads(self.value(x), self.heads)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
        ctx = merge_heads(scores.softmax(dim=-1) @ v)
        x = self.attn_norm(self.attn_out(ctx) + x)
        return self.out_norm(self.output(F.gelu(self.intermediate(x))) + x)


class Bert(nn.Module):
    OUTPUTS = ("last_hidden_state", "pooler_output")

    def __init__(self, c: BertConfig):
        super().__init__()
        self.words = nn.Embedding(c.vocab, c.hidden)
        self.positions = nn.Embedding(c.max_positions, c.hidden)
        self.types = nn.Embedding(c.type_vocab, c.hidden)
        self.norm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.layers))
        self.pooler = nn.Linear(c.hidden, c.hidden)
        positions = torch.arange(c.max_positions).unsqueeze(0)
        self.register_buffer("position_ids", positions, persistent=False)
        self.register_buffer("token_type_ids", torch.zeros_like(positions), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        seq = input_ids.shape[1]
        x = (
            self.words(input_ids)
            + self.types(self.token_type_ids[:, :seq])
            + self.positions(self.position_ids[:, :seq])
        )
        x = self.norm(x)
        # (batch, seq) 1/0 -> (batch, 1, 1, seq) 0/-inf-ish, added to the scores
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


# ---------------------------------------------------------------- GPT-2


@dataclass(frozen=True)
class Gpt2Config:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    vocab: int = 50257
    max_positions: int = 1024
    eps: float = 1e-5
    batch: int = 1
    seq: int = 128

    def inputs(self) -> tuple[Input, ...]:
        return token_inputs(self.batch, self.seq, self.vocab, mask=False)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's ``gelu_new``, written out as in the original code."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


class Gpt2Block(nn.Module):
    def __init__(self, c: Gpt2Config):
        super().__init__()
        self.heads, self.hidden = c.heads, c.hidden
        self.ln_1 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.c_attn = nn.Linear(c.hidden, 3 * c.hidden)
        self.c_proj = nn.Linear(c.hidden, c.hidden)
        self.ln_2 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.c_fc = nn.Linear(c.hidden, 4 * c.hidden)
        self.mlp_proj = nn.Linear(4 * c.hidden, c.hidden)
        causal = torch.tril(torch.ones(c.max_positions, c.max_positions, dtype=torch.bool))
        self.register_buffer("bias", causal.view(1, 1, c.max_positions, c.max_positions), False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.heads) for t in self.c_attn(x).split(self.hidden, dim=2))
        scores = q @ k.transpose(-1, -2)
        scores = scores / torch.full([], v.size(-1) ** 0.5, dtype=scores.dtype)
        seq = q.size(-2)
        causal = self.bias[:, :, :seq, :seq]
        floor = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype)
        scores = torch.where(causal, scores, floor)
        return self.c_proj(merge_heads(scores.softmax(dim=-1) @ v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(gelu_tanh(self.c_fc(self.ln_2(x))))


class Gpt2(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: Gpt2Config):
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.hidden)
        self.wpe = nn.Embedding(c.max_positions, c.hidden)
        self.blocks = nn.ModuleList(Gpt2Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], dtype=torch.long).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # LM head tied to the embedding


# ---------------------------------------------------------------- ViT


@dataclass(frozen=True)
class VitConfig:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    image: int = 224
    patch: int = 16
    channels: int = 3
    classes: int = 1000
    eps: float = 1e-12
    batch: int = 1

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, self.channels, self.image, self.image)
        return (Input("pixel_values", shape, dynamic=((0, "batch"),)),)


class VitLayer(nn.Module):
    def __init__(self, c: VitConfig):
        super().__init__()
        self.heads = c.heads
        self.norm_1 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        self.proj = nn.Linear(c.hidden, c.hidden)
        self.norm_2 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.fc1 = nn.Linear(c.hidden, c.intermediate)
        self.fc2 = nn.Linear(c.intermediate, c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(self.norm_1(x)).chunk(3, dim=-1))
        x = x + self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v)))
        return x + self.fc2(F.gelu(self.fc1(self.norm_2(x))))


class Vit(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: VitConfig):
        super().__init__()
        patches = (c.image // c.patch) ** 2
        self.patch = nn.Conv2d(c.channels, c.hidden, c.patch, stride=c.patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, c.hidden))
        self.position = nn.Parameter(torch.randn(1, patches + 1, c.hidden) * 0.1)
        self.layers = nn.ModuleList(VitLayer(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.head = nn.Linear(c.hidden, c.classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixel_values).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


# ---------------------------------------------------------------- nn.TransformerEncoder


@dataclass(frozen=True)
class TorchEncoderConfig:
    layers: int = 6
    hidden: int = 512
    heads: int = 8
    intermediate: int = 2048
    activation: str = "relu"
    norm_first: bool = False
    batch: int = 1
    seq: int = 128

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, self.seq, self.hidden)
        return (Input("x", shape, dynamic=((0, "batch"), (1, "sequence"))),)


class TorchEncoder(nn.Module):
    """``nn.TransformerEncoder`` (batch first, no mask): the wrapper keeps the
    exported forward to one tensor argument.  The TorchScript exporter bakes
    the example's batch and sequence sizes into nn.MultiheadAttention's
    reshapes, so only the dynamo export can have dynamic axes."""

    OUTPUTS = ("y",)
    TORCHSCRIPT_DYNAMIC_AXES = False

    def __init__(self, c: TorchEncoderConfig):
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            c.hidden,
            c.heads,
            c.intermediate,
            dropout=0.0,
            activation=c.activation,
            batch_first=True,
            norm_first=c.norm_first,
        )
        self.encoder = nn.TransformerEncoder(layer, c.layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)
