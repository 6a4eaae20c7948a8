"""ConvNeXt in plain torch (random weights); ``base`` is ConvNeXt-T.

A block is a depthwise 7x7 conv, then channels-last: permute to NHWC,
LayerNorm over channels, Linear to four times the width, GELU (erf), Linear
back, a per-channel layer scale, permute back, and the residual Add.  The
stem is a 4x4/4 "patchify" conv and a LayerNorm; between stages a LayerNorm
and a 2x2/2 conv; the head a global average pool, LayerNorm and Linear.
The layer scales are random here, not ConvNeXt's initial 1e-6, so that no
block is an identity.  ConvNeXt-T: stages 3, 3, 9, 3 at 96..768, 28.6 M
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input


@dataclass(frozen=True)
class ConvNextConfig:
    widths: tuple[int, ...] = (96, 192, 384, 768)
    depths: tuple[int, ...] = (3, 3, 9, 3)
    image: int = 224
    channels: int = 3
    classes: int = 1000
    eps: float = 1e-6
    batch: int = 1

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, self.channels, self.image, self.image)
        return (Input("image", shape, dynamic=((0, "batch"),)),)


class ChannelsLastNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (permute, norm, permute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNextBlock(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(0.1 + 0.4 * torch.rand(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.layer_scale * y).permute(0, 3, 1, 2)


class ConvNext(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: ConvNextConfig):
        super().__init__()
        w = c.widths[0]
        layers: list[nn.Module] = [nn.Conv2d(c.channels, w, 4, 4), ChannelsLastNorm(w, c.eps)]
        for k, (width, depth) in enumerate(zip(c.widths, c.depths, strict=True)):
            if k > 0:
                layers += [ChannelsLastNorm(w, c.eps), nn.Conv2d(w, width, 2, 2)]
            layers += [ConvNextBlock(width, c.eps) for _ in range(depth)]
            w = width
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(w, eps=c.eps)
        self.head = nn.Linear(w, c.classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(image).mean((2, 3))))
