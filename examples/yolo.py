"""A YOLO-style detector in plain torch (random weights): a small strided
backbone and, what this example is for, a PAN/FPN neck over three scales.

Every conv is Conv + BatchNorm + SiLU.  The backbone halves the image five
times and keeps the features at strides 8, 16 and 32 (P3, P4, P5), P5 after
an SPPF (three chained 5x5 max pools, concatenated).  The neck goes top-down
(nearest 2x upsample, Concat with the finer scale, a CSP block) and then
bottom-up (3x3/2 conv, Concat with the top-down feature, a CSP block); a CSP
block is two parallel 1x1 convs, residual bottlenecks on one, Concat, 1x1.
A 1x1 head per scale predicts ``outputs`` channels per cell (e.g. 4 box + 80
classes).  ``base`` is about YOLOv5s / v8s: widths 128, 256, 512 at 640x640.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.export import Input


@dataclass(frozen=True)
class YoloConfig:
    widths: tuple[int, int, int] = (128, 256, 512)  # P3, P4, P5
    stem: int = 32
    depth: int = 1  # bottlenecks per CSP block
    outputs: int = 84
    image: int = 640
    batch: int = 1

    def inputs(self) -> tuple[Input, ...]:
        shape = (self.batch, 3, self.image, self.image)
        return (Input("image", shape, dynamic=((0, "batch"),)),)


def conv(cin: int, cout: int, k: int = 1, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU()
    )


class Bottleneck(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(conv(c, c, 1), conv(c, c, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class Csp(nn.Module):
    def __init__(self, cin: int, cout: int, depth: int):
        super().__init__()
        mid = cout // 2
        self.main = nn.Sequential(conv(cin, mid), *(Bottleneck(mid) for _ in range(depth)))
        self.skip = conv(cin, mid)
        self.out = conv(2 * mid, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat((self.main(x), self.skip(x)), dim=1))


class Sppf(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.reduce = conv(c, c // 2)
        self.out = conv(2 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = [self.reduce(x)]
        for _ in range(3):
            pooled.append(F.max_pool2d(pooled[-1], 5, 1, 2))
        return self.out(torch.cat(pooled, dim=1))


class Yolo(nn.Module):
    OUTPUTS = ("p3", "p4", "p5")

    def __init__(self, c: YoloConfig):
        super().__init__()
        w3, w4, w5 = c.widths
        self.stem = nn.Sequential(
            conv(3, c.stem, 3, 2),
            conv(c.stem, w3 // 2, 3, 2),
            Csp(w3 // 2, w3 // 2, c.depth),
            conv(w3 // 2, w3, 3, 2),
            Csp(w3, w3, c.depth),
        )
        self.down4 = nn.Sequential(conv(w3, w4, 3, 2), Csp(w4, w4, c.depth))
        self.down5 = nn.Sequential(conv(w4, w5, 3, 2), Csp(w5, w5, c.depth), Sppf(w5))
        # top-down
        self.td4 = Csp(w5 + w4, w4, c.depth)
        self.td3 = Csp(w4 + w3, w3, c.depth)
        # bottom-up
        self.bu4_down, self.bu4 = conv(w3, w3, 3, 2), Csp(w3 + w4, w4, c.depth)
        self.bu5_down, self.bu5 = conv(w4, w4, 3, 2), Csp(w4 + w5, w5, c.depth)
        self.heads = nn.ModuleList(nn.Conv2d(w, c.outputs, 1) for w in c.widths)

    def forward(self, image: torch.Tensor):
        p3 = self.stem(image)
        p4 = self.down4(p3)
        p5 = self.down5(p4)
        up = F.interpolate
        t4 = self.td4(torch.cat((up(p5, scale_factor=2.0, mode="nearest"), p4), dim=1))
        n3 = self.td3(torch.cat((up(t4, scale_factor=2.0, mode="nearest"), p3), dim=1))
        n4 = self.bu4(torch.cat((self.bu4_down(n3), t4), dim=1))
        n5 = self.bu5(torch.cat((self.bu5_down(n4), p5), dim=1))
        return tuple(head(x) for head, x in zip(self.heads, (n3, n4, n5), strict=True))
