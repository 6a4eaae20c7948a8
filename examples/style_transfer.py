"""A fast style-transfer network in plain torch (random weights), the
architecture of the ONNX model zoo's "candy" / "mosaic" models (Johnson et
al.'s image transformation network as in PyTorch's fast_neural_style).

Reflect-padded convs with InstanceNorm (affine) and ReLU: a 9x9 conv, two
strided 3x3 downsampling convs, residual blocks (conv, norm, ReLU, conv,
norm, Add), two nearest 2x upsamplings each followed by a conv, and a final
9x9 conv back to three channels.  The output is the stylised image, the same
size as the input.  ``base``: widths 32, 64, 128, five residual blocks,
224x224 (the zoo model's input size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input


@dataclass(frozen=True)
class StyleConfig:
    widths: tuple[int, int, int] = (32, 64, 128)
    residual_blocks: int = 5
    image: int = 224
    batch: int = 1

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, 3, self.image, self.image)
        return (Input("image", shape, dynamic=((0, "batch"),)),)


class ConvLayer(nn.Module):
    """Reflect Pad + Conv; with ``upsample`` a nearest 2x Resize first."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, upsample: bool = False):
        super().__init__()
        self.upsample = upsample
        self.pad = k // 2
        self.conv = nn.Conv2d(cin, cout, k, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.conv(F.pad(x, (self.pad,) * 4, mode="reflect"))


def conv_norm_relu(cin: int, cout: int, k: int, stride: int = 1, upsample: bool = False):
    return nn.Sequential(
        ConvLayer(cin, cout, k, stride, upsample), nn.InstanceNorm2d(cout, affine=True), nn.ReLU()
    )


class ResidualBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(
            ConvLayer(c, c, 3),
            nn.InstanceNorm2d(c, affine=True),
            nn.ReLU(),
            ConvLayer(c, c, 3),
            nn.InstanceNorm2d(c, affine=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class StyleTransfer(nn.Module):
    OUTPUTS = ("stylized",)

    def __init__(self, c: StyleConfig):
        super().__init__()
        a, b, w = c.widths
        self.body = nn.Sequential(
            conv_norm_relu(3, a, 9),
            conv_norm_relu(a, b, 3, 2),
            conv_norm_relu(b, w, 3, 2),
            *(ResidualBlock(w) for _ in range(c.residual_blocks)),
            conv_norm_relu(w, b, 3, upsample=True),
            conv_norm_relu(b, a, 3, upsample=True),
            ConvLayer(a, 3, 9),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.body(image)
