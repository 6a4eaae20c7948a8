"""ResNet-50 in plain torch (random weights): bottleneck blocks.

Each block is 1x1 reduce, 3x3 (the stride is here, as in torchvision's
"v1.5"), 1x1 expand by four, each Conv + BatchNorm, ReLU between, and a
residual Add (through a strided 1x1 Conv + BatchNorm where the shape
changes).  Stem: 7x7/2 conv, 3x3/2 max pool; head: global average pool and a
Linear.  ``base`` is ResNet-50 itself (stages 3, 4, 6, 3; 25.6 M parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from examples.cnns import conv_bn, resnet_stem
from examples.export import Input


@dataclass(frozen=True)
class ResNet50Config:
    """``widths`` are the bottleneck widths of the stages (their outputs are
    ``expansion`` times wider); ``depths`` blocks per stage."""

    widths: tuple[int, ...] = (64, 128, 256, 512)
    depths: tuple[int, ...] = (3, 4, 6, 3)
    expansion: int = 4
    image: int = 224
    channels: int = 3
    classes: int = 1000
    batch: int = 1

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, self.channels, self.image, self.image)
        return (Input("image", shape, dynamic=((0, "batch"),)),)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(cin, width, 1),
            nn.ReLU(),
            conv_bn(width, width, 3, stride),
            nn.ReLU(),
            conv_bn(width, cout, 1),
        )
        self.shortcut = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(self.body(x) + skip)


class ResNet50(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: ResNet50Config):
        super().__init__()
        w = c.widths[0]
        self.stem = resnet_stem(c.channels, w)
        blocks = []
        for k, (width, depth) in enumerate(zip(c.widths, c.depths, strict=True)):
            for d in range(depth):
                stride = 2 if k > 0 and d == 0 else 1
                blocks.append(Bottleneck(w, width, width * c.expansion, stride))
                w = width * c.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(w, c.classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(image))), 1))
