"""Convolutional networks in plain torch (random weights), one image input.

* :class:`ResNet`    - Conv + BatchNorm + ReLU, residual Add, MaxPool with
  padding, AdaptiveAvgPool, Flatten, Linear (basic blocks, ResNet-18 shape).
* :class:`MobileNet` - MobileNetV3-style inverted residuals: depthwise Conv
  (groups = channels), HardSwish, ReLU6 (Clip), squeeze-excite gated by
  HardSigmoid.
* :class:`UNet`      - dilated Conv2d, GroupNorm and InstanceNorm, LeakyReLU,
  AvgPool down, nearest and bilinear Upsample (Resize) up, Concat skips.
* :class:`Inception` - an old-school branchy net: reflect Pad, LRN, parallel
  branches concatenated, several tensors summed, Sigmoid gate, Softmax head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input


@dataclass(frozen=True)
class CnnConfig:
    """``widths`` are the stage widths; ``depth`` blocks per stage."""

    widths: tuple[int, ...] = (64, 128, 256, 512)
    depth: int = 2
    image: int = 224
    channels: int = 3
    classes: int = 1000
    batch: int = 1

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, self.channels, self.image, self.image)
        return (Input("image", shape, dynamic=((0, "batch"),)),)


class Lrn(torch.autograd.Function):
    """``F.local_response_norm`` that the TorchScript exporter writes as one
    ONNX LRN node (torch itself only has the pad/pool/pow composition, which
    the dynamo exporter still produces)."""

    @staticmethod
    def forward(ctx, x, size: int, alpha: float, beta: float, k: float):
        return F.local_response_norm(x, size, alpha, beta, k)

    @staticmethod
    def symbolic(g, x, size, alpha, beta, k):
        return g.op("LRN", x, size_i=size, alpha_f=alpha, beta_f=beta, bias_f=k)


class SumOf(torch.autograd.Function):
    """Elementwise sum of several tensors, written as one ONNX Sum node by the
    TorchScript exporter (an Add chain under dynamo)."""

    @staticmethod
    def forward(ctx, *xs):
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        return total

    @staticmethod
    def symbolic(g, *xs):
        return g.op("Sum", *xs)


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)
    )


# ---------------------------------------------------------------- ResNet


def resnet_stem(channels: int, width: int) -> nn.Sequential:
    """ResNet's stem: a 7x7 stride-2 conv, batch norm, ReLU, 3x3 stride-2 max pool."""
    return nn.Sequential(
        nn.Conv2d(channels, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, padding=1),
    )


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3)
        self.shortcut = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + skip)


class ResNet(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: CnnConfig):
        super().__init__()
        w = c.widths[0]
        self.stem = resnet_stem(c.channels, w)
        blocks = []
        for k, width in enumerate(c.widths):
            for d in range(c.depth):
                blocks.append(BasicBlock(w, width, 2 if k > 0 and d == 0 else 1))
                w = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(w, c.classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(image))), 1))


# ---------------------------------------------------------------- MobileNet


class SqueezeExcite(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        squeezed = max(8, c // 4)
        self.reduce = nn.Conv2d(c, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.expand(torch.relu(self.reduce(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int, hard: bool, se: bool):
        super().__init__()
        mid = cin * expand
        act = nn.Hardswish if hard else nn.ReLU6
        self.body = nn.Sequential(
            conv_bn(cin, mid, 1),
            act(),
            conv_bn(mid, mid, 3, stride, groups=mid),
            act(),
            SqueezeExcite(mid) if se else nn.Identity(),
            conv_bn(mid, cout, 1),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNet(nn.Module):
    OUTPUTS = ("logits",)

    def __init__(self, c: CnnConfig):
        super().__init__()
        w = c.widths[0]
        self.stem = nn.Sequential(conv_bn(c.channels, w, 3, 2), nn.Hardswish())
        blocks = []
        for k, width in enumerate(c.widths):
            for d in range(c.depth):
                stride = 2 if d == 0 else 1
                blocks.append(InvertedResidual(w, width, stride, 4, hard=k % 2 == 1, se=k > 0))
                w = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            conv_bn(w, 6 * w, 1),
            nn.Hardswish(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(6 * w, 4 * w),
            nn.Hardswish(),
            nn.Linear(4 * w, c.classes),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(image)))


# ---------------------------------------------------------------- UNet


class DoubleConv(nn.Module):
    """Two 3x3 convs, the second dilated; GroupNorm or InstanceNorm; LeakyReLU."""

    def __init__(self, cin: int, cout: int, instance: bool):
        super().__init__()
        norm = (
            (lambda: nn.InstanceNorm2d(cout, affine=True))
            if instance
            else (lambda: nn.GroupNorm(min(4, cout), cout))
        )
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1),
            norm(),
            nn.LeakyReLU(0.1),
            nn.Conv2d(cout, cout, 3, padding=2, dilation=2),
            norm(),
            nn.LeakyReLU(0.1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UNet(nn.Module):
    """Image in, per-pixel ``classes`` logits out (same height and width)."""

    OUTPUTS = ("mask",)

    def __init__(self, c: CnnConfig):
        super().__init__()
        widths = c.widths
        self.down = nn.ModuleList()
        cin = c.channels
        for k, w in enumerate(widths):
            self.down.append(DoubleConv(cin, w, instance=k % 2 == 1))
            cin = w
        self.up = nn.ModuleList()
        for k in range(len(widths) - 2, -1, -1):
            self.up.append(DoubleConv(widths[k + 1] + widths[k], widths[k], instance=k % 2 == 0))
        self.out = nn.Conv2d(widths[0], c.classes, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        skips = []
        x = image
        for k, block in enumerate(self.down):
            if k > 0:
                x = F.avg_pool2d(x, 2)
            x = block(x)
            skips.append(x)
        skips.pop()
        for k, block in enumerate(self.up):
            if k % 2 == 0:
                x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            else:
                x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
            x = block(torch.cat((x, skips.pop()), dim=1))
        return self.out(x)


# ---------------------------------------------------------------- Inception


class InceptionBlock(nn.Module):
    """Four branches concatenated, plus the sum of three same-width branches
    gating the result through a Sigmoid."""

    def __init__(self, cin: int, w: int):
        super().__init__()
        self.b1 = nn.Conv2d(cin, w, 1)
        self.b3 = nn.Conv2d(cin, w, 3)  # padded by a reflect Pad in forward
        self.b5 = nn.Conv2d(cin, w, 5, padding=2)
        self.bp = nn.Conv2d(cin, w, 1)
        self.gate = nn.Conv2d(w, 4 * w, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.b1(x))
        b = torch.relu(self.b3(F.pad(x, (1, 1, 1, 1), mode="reflect")))
        c = torch.relu(self.b5(x))
        d = torch.relu(self.bp(F.max_pool2d(x, 3, 1, 1)))
        total = SumOf.apply(a, b, c)
        return torch.cat((a, b, c, d), dim=1) * torch.sigmoid(self.gate(total))


class Inception(nn.Module):
    OUTPUTS = ("probs",)

    def __init__(self, c: CnnConfig):
        super().__init__()
        w = c.widths[0]
        self.stem = nn.Conv2d(c.channels, w, 7, 2, 3)
        blocks, cin = [], w
        for width in c.widths:
            blocks.append(InceptionBlock(cin, width))
            cin = 4 * width
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, c.classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = Lrn.apply(torch.relu(self.stem(image)), 5, 1e-4, 0.75, 2.0)
        for k, block in enumerate(self.blocks):
            if k > 0:
                x = F.max_pool2d(x, 3, 2, 1, ceil_mode=True)
            x = block(x)
        return torch.softmax(self.fc(x.mean((2, 3))), dim=-1)
