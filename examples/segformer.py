"""SegFormer-style semantic segmentation in plain torch (random weights);
``base`` is SegFormer-B0 at 512x512 with ADE20K's 150 classes.

The encoder (Mix Transformer) has four stages, each:

* an overlapping patch embedding: a strided Conv wider than its stride
  (7x7/4 first, then 3x3/2), flattened to tokens, LayerNorm;
* blocks of efficient self-attention, whose keys and values come from the
  tokens spatially reduced by a ``sr x sr`` strided Conv + LayerNorm (so the
  scores are N x N/sr^2), and a Mix-FFN: Linear, a depthwise 3x3 Conv on the
  tokens laid back out as an image, GELU, Linear; pre-norm residuals;
* a LayerNorm, and the tokens back to an NCHW image.

The all-MLP decoder projects each stage to one width, resizes all four to
the first stage's size (bilinear), concatenates, fuses with a 1x1 Conv +
BatchNorm + ReLU, and classifies each pixel (output at 1/4 resolution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input


@dataclass(frozen=True)
class SegFormerConfig:
    widths: tuple[int, ...] = (32, 64, 160, 256)
    depths: tuple[int, ...] = (2, 2, 2, 2)
    heads: tuple[int, ...] = (1, 2, 5, 8)
    reductions: tuple[int, ...] = (8, 4, 2, 1)  # spatial reduction of keys / values
    mlp_ratio: int = 4
    decoder: int = 256
    image: int = 512
    channels: int = 3
    classes: int = 150
    batch: int = 1

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, self.channels, self.image, self.image)
        return (Input("image", shape, dynamic=((0, "batch"),)),)


def to_image(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(batch, h*w, c) -> (batch, c, h, w)."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, h, w)


def to_tokens(image: torch.Tensor) -> torch.Tensor:
    """(batch, c, h, w) -> (batch, h*w, c)."""
    return image.flatten(2).transpose(1, 2)


class PatchEmbed(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, k, stride, k // 2)
        self.norm = nn.LayerNorm(cout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        return self.norm(to_tokens(x)), x.shape[2], x.shape[3]


class EfficientAttention(nn.Module):
    def __init__(self, dim: int, heads: int, reduction: int):
        super().__init__()
        self.heads, self.dim = heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.reduce = None
        if reduction > 1:
            self.reduce = nn.Conv2d(dim, dim, reduction, reduction)
            self.norm = nn.LayerNorm(dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, self.dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        q = self.split_heads(self.q(x))
        kv = x if self.reduce is None else self.norm(to_tokens(self.reduce(to_image(x, h, w))))
        k, v = self.split_heads(self.k(kv)), self.split_heads(self.v(kv))
        probs = F.softmax(q @ k.transpose(2, 3) / math.sqrt(self.dim), dim=-1)
        return self.proj((probs @ v).transpose(1, 2).reshape(b, n, c))


class MixFfn(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        y = to_tokens(self.dwconv(to_image(self.fc1(x), h, w)))
        return self.fc2(F.gelu(y))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, reduction: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = EfficientAttention(dim, heads, reduction)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = MixFfn(dim, mlp_ratio * dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), h, w)
        return x + self.ffn(self.norm2(x), h, w)


class Stage(nn.Module):
    def __init__(self, cin: int, c: SegFormerConfig, k: int):
        super().__init__()
        dim = c.widths[k]
        self.embed = PatchEmbed(cin, dim, 7, 4) if k == 0 else PatchEmbed(cin, dim, 3, 2)
        self.blocks = nn.ModuleList(
            Block(dim, c.heads[k], c.reductions[k], c.mlp_ratio) for _ in range(c.depths[k])
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h, w = self.embed(x)
        for block in self.blocks:
            x = block(x, h, w)
        return to_image(self.norm(x), h, w)


class SegFormer(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: SegFormerConfig):
        super().__init__()
        cins = (c.channels, *c.widths[:-1])
        self.stages = nn.ModuleList(Stage(cin, c, k) for k, cin in enumerate(cins))
        self.project = nn.ModuleList(nn.Linear(w, c.decoder) for w in c.widths)
        self.fuse = nn.Sequential(
            nn.Conv2d(len(c.widths) * c.decoder, c.decoder, 1, bias=False),
            nn.BatchNorm2d(c.decoder),
            nn.ReLU(),
        )
        self.classify = nn.Conv2d(c.decoder, c.classes, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features, x = [], image
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        size = features[0].shape[2:]
        decoded = []
        for f, project in zip(features, self.project, strict=True):
            y = to_image(project(to_tokens(f)), f.shape[2], f.shape[3])
            if y.shape[2:] != size:
                y = F.interpolate(y, size=size, mode="bilinear", align_corners=False)
            decoded.append(y)
        # SegFormer concatenates the deepest stage first
        return self.classify(self.fuse(torch.cat(decoded[::-1], dim=1)))
