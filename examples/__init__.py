"""Example models: plain-torch builders with random weights, exported to ONNX.

:data:`EXAMPLES` maps a name to an :class:`Example`: the model class and its
configs by size (``tiny`` for tests, ``base`` for benchmarks: the real
model's sizes, except the Llama-style ones, whose ``base`` is the 24-layer
decoder the planner benchmark uses; ``llama`` also has ``wide``, four layers
at width 2048 with head dim 128, the benchmark suite's decoder:
``examples.suite``; ``decode`` is one step of that decoder with a key/value
cache, ``wide`` at 512 cached tokens).  :func:`build_model` makes the model with seeded
random weights; :func:`export_example` writes it as ONNX.

    >>> from examples import export_example
    >>> model, inputs = export_example("bert", "bert.onnx", dynamo=False, opset=17)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import onnx
import torch
from torch import nn

from examples.cnns import CnnConfig, Inception, MobileNet, ResNet, UNet
from examples.convnext import ConvNext, ConvNextConfig
from examples.decoder import WIDE as _WIDE_DECODE
from examples.decoder import DecodeConfig, DecodeStep
from examples.export import ExportError, Input, dynamic_axes_of, export, random_inputs
from examples.llama import Llama, LlamaConfig
from examples.resnet50 import ResNet50, ResNet50Config
from examples.segformer import SegFormer, SegFormerConfig
from examples.style_transfer import StyleConfig, StyleTransfer
from examples.t5 import T5Config, T5Encoder
from examples.transformers import (
    Bert,
    BertConfig,
    Gpt2,
    Gpt2Config,
    TorchEncoder,
    TorchEncoderConfig,
    Vit,
    VitConfig,
)
from examples.yolo import Yolo, YoloConfig


@dataclass(frozen=True)
class Example:
    name: str
    model: type[nn.Module]
    sizes: Mapping[str, Any]  # size name -> config dataclass

    def config(self, size: str = "tiny", **overrides):
        if size not in self.sizes:
            raise KeyError(f"{self.name}: no size {size!r} (sizes: {', '.join(self.sizes)})")
        return replace(self.sizes[size], **overrides)


_TINY_BERT = BertConfig(
    layers=2, hidden=64, heads=4, intermediate=128, vocab=1000, max_positions=64, seq=16
)
_TINY_LLAMA = LlamaConfig(
    layers=2, hidden=64, heads=4, kv_heads=2, intermediate=160, vocab=1000, max_positions=64, seq=16
)
# the planner benchmark's decoder: 24 layers, ~1,500 nodes from the dynamo exporter
_PLANNER_LLAMA = LlamaConfig(
    layers=24,
    hidden=512,
    heads=8,
    kv_heads=2,
    intermediate=1408,
    vocab=32000,
    max_positions=2048,
    seq=128,
)
# the benchmark suite's decoder: head dim 128, four query heads per key/value head
_WIDE_LLAMA = LlamaConfig(
    layers=4,
    hidden=2048,
    heads=16,
    kv_heads=4,
    intermediate=5632,
    vocab=32000,
    max_positions=2048,
    seq=128,
)
_TINY_CNN = CnnConfig(widths=(8, 16), depth=1, image=32, classes=10)

EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in (
        Example("bert", Bert, {"tiny": _TINY_BERT, "base": BertConfig()}),
        Example(
            "gpt2",
            Gpt2,
            {
                "tiny": Gpt2Config(
                    layers=2, hidden=64, heads=4, vocab=1000, max_positions=64, seq=16
                ),
                "base": Gpt2Config(),
            },
        ),
        Example(
            "vit",
            Vit,
            {
                "tiny": VitConfig(
                    layers=2, hidden=64, heads=4, intermediate=128, image=32, patch=8, classes=10
                ),
                "base": VitConfig(),
            },
        ),
        Example("llama", Llama, {"tiny": _TINY_LLAMA, "base": _PLANNER_LLAMA, "wide": _WIDE_LLAMA}),
        # one step of decoding with a key/value cache, at a fixed past length
        # (examples/decode.py exports it with the past dynamic)
        Example("decode", DecodeStep, {"tiny": DecodeConfig(), "wide": _WIDE_DECODE}),
        Example(
            "mistral",
            Llama,
            {
                "tiny": replace(_TINY_LLAMA, sliding_window=5),
                "base": replace(_PLANNER_LLAMA, sliding_window=64),
            },
        ),
        Example(
            "t5",
            T5Encoder,
            {
                "tiny": T5Config(
                    layers=2,
                    hidden=64,
                    heads=4,
                    head_dim=16,
                    intermediate=128,
                    vocab=1000,
                    buckets=8,
                    max_distance=16,
                    seq=16,
                ),
                "base": T5Config(),
            },
        ),
        Example(
            "torch_encoder",
            TorchEncoder,
            {
                "tiny": TorchEncoderConfig(layers=2, hidden=64, heads=4, intermediate=128, seq=16),
                "base": TorchEncoderConfig(),
            },
        ),
        Example("resnet", ResNet, {"tiny": _TINY_CNN, "base": CnnConfig()}),
        Example(
            "mobilenet",
            MobileNet,
            {
                "tiny": _TINY_CNN,
                "base": CnnConfig(widths=(16, 24, 40, 80, 112, 160), depth=2),
            },
        ),
        Example(
            "unet",
            UNet,
            {
                "tiny": CnnConfig(widths=(8, 16, 32), image=32, classes=2),
                "base": CnnConfig(widths=(64, 128, 256, 512), image=256, classes=2),
            },
        ),
        Example(
            "inception",
            Inception,
            {
                "tiny": CnnConfig(widths=(8, 8), image=32, classes=10),
                "base": CnnConfig(widths=(64, 96, 128, 128), image=224),
            },
        ),
        Example(
            "resnet50",
            ResNet50,
            {
                "tiny": ResNet50Config(widths=(8, 16), depths=(1, 2), image=32, classes=10),
                "base": ResNet50Config(),
            },
        ),
        Example(
            "convnext",
            ConvNext,
            {
                "tiny": ConvNextConfig(widths=(8, 16), depths=(1, 2), image=32, classes=10),
                "base": ConvNextConfig(),
            },
        ),
        Example(
            "segformer",
            SegFormer,
            {
                "tiny": SegFormerConfig(
                    widths=(8, 16, 24, 32),
                    depths=(1, 1, 1, 1),
                    heads=(1, 2, 3, 4),
                    reductions=(4, 2, 2, 1),
                    decoder=16,
                    image=64,
                    classes=4,
                ),
                "base": SegFormerConfig(),
            },
        ),
        Example(
            "style_transfer",
            StyleTransfer,
            {
                "tiny": StyleConfig(widths=(4, 8, 8), residual_blocks=1, image=16),
                "base": StyleConfig(),
            },
        ),
        Example(
            "yolo",
            Yolo,
            {
                "tiny": YoloConfig(widths=(8, 16, 32), stem=4, outputs=6, image=64),
                "base": YoloConfig(),
            },
        ),
    )
}


def build_model(name: str, size: str = "tiny", seed: int = 0, **overrides):
    """(model in eval mode, its inputs) for example ``name``: seeded random
    weights, and norm scales/shifts and BatchNorm statistics perturbed away
    from their identity initial values so that every parameter matters."""
    example = EXAMPLES[name]
    config = example.config(size, **overrides)
    torch.manual_seed(seed)
    model = example.model(config)
    perturb_norms(model, seed)
    return model.eval(), config.inputs()


def perturb_norms(model: nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            weight, bias = getattr(m, "weight", None), getattr(m, "bias", None)
            is_norm = isinstance(m, nn.modules.batchnorm._NormBase | nn.LayerNorm | nn.GroupNorm)
            if is_norm or type(m).__name__ in ("RmsNorm", "T5LayerNorm"):
                if isinstance(weight, torch.Tensor):
                    weight.copy_(1 + 0.2 * torch.randn(weight.shape, generator=gen))
                if isinstance(bias, torch.Tensor):
                    bias.copy_(0.2 * torch.randn(bias.shape, generator=gen))
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))


def export_example(
    name: str,
    path: str | os.PathLike,
    *,
    dynamo: bool,
    opset: int,
    size: str = "tiny",
    dynamic: bool = False,
    seed: int = 0,
    **overrides,
) -> tuple[onnx.ModelProto, tuple[Input, ...]]:
    """Build example ``name`` and export it to ``path``; with ``dynamic`` its
    batch / sequence axes are symbolic.  Returns (written model, inputs)."""
    if dynamic and EXAMPLES[name].config(size).batch < 2:
        overrides.setdefault("batch", 2)  # torch.export specialises a size-1 axis
    model, inputs = build_model(name, size, seed, **overrides)
    if dynamic and not dynamo and not getattr(model, "TORCHSCRIPT_DYNAMIC_AXES", True):
        raise ExportError(f"{name}: the TorchScript exporter cannot make its axes dynamic")
    feeds = random_inputs(inputs, seed)
    args = [torch.from_numpy(feeds[i.name]) for i in inputs]
    written = export(
        model,
        args,
        path,
        dynamo=dynamo,
        opset=opset,
        input_names=[i.name for i in inputs],
        output_names=list(model.OUTPUTS),
        dynamic_axes=dynamic_axes_of(inputs) if dynamic else None,
    )
    return written, inputs


__all__ = [
    "EXAMPLES",
    "Example",
    "ExportError",
    "Input",
    "build_model",
    "export",
    "export_example",
    "perturb_norms",
    "random_inputs",
]
