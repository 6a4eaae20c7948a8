"""One decoding step of a causal language model with a key/value cache, in
plain torch (random weights): Llama-, Qwen2- and GPT-2-style.

The step takes one new token and the cache of every earlier one and returns
the next token's logits and the cache grown by one row, as onnxruntime GenAI
and Hugging Face's ``past_key_values`` export it:

    input_ids       [1, 1]                            int64
    attention_mask  [1, past + 1]                     int64 (1: attend, 0: padding)
    past_k, past_v  [layers, 1, kv_heads, past, head_dim]
    -> logits [1, 1, vocab], present_k, present_v [layers, 1, kv_heads, past + 1, head_dim]

The new token's position is the mask's sum minus one, so masked slots (a
cache padded to the bundle's least past length) do not move it. Llama:
RMSNorm, rotary embeddings, grouped-query attention, a SiLU-gated MLP; Qwen2
adds biases to the query, key and value projections; GPT-2: LayerNorm,
learned positions, multi-head attention, a tanh-GELU MLP.

    python -m examples.decode llama out/llama_decode.onnx [--dynamo]
    python -m examples.decode llama out/llama_prefill.onnx --prefill
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from examples.decoder import (
    INPUTS,
    OUTPUTS,
    STYLES,
    DecodeStep,
    PrefillStep,
    config,
    example_inputs,
    model,
)
from examples.export import export

# the model's names, for callers of this module (tests, tools)
__all__ = [
    "DYNAMIC_AXES",
    "INPUTS",
    "OUTPUTS",
    "STYLES",
    "config",
    "example_inputs",
    "export_decode",
    "export_prefill",
    "export_step",
    "greedy_reference",
    "model",
]

# the past length is one symbol; the mask's axis is written past + 1
DYNAMIC_AXES = {
    "attention_mask": {1: "past + 1"},
    "past_k": {3: "past"},
    "past_v": {3: "past"},
    "present_k": {3: "past + 1"},
    "present_v": {3: "past + 1"},
}


# the prefill step: ``seq`` new tokens after ``past`` cached ones
PREFILL_AXES = {
    "input_ids": {1: "seq"},
    "attention_mask": {1: "past + seq"},
    "past_k": {3: "past"},
    "past_v": {3: "past"},
    "logits": {1: "seq"},
    "present_k": {3: "past + seq"},
    "present_v": {3: "past + seq"},
}


def export_prefill(style: str, path: str | Path, *, opset: int = 18):
    """The prompt step of ``style`` (``PrefillStep``, the decode step's
    weights) exported by the TorchScript exporter with ``seq`` and ``past``
    dynamic (``PREFILL_AXES``)."""
    step = model(style)
    prefill = PrefillStep(step.c).eval()
    prefill.load_state_dict(step.state_dict())
    c = step.c
    g = torch.Generator().manual_seed(0)
    cache = (c.layers, 1, c.kv_heads, 2, c.head_dim)
    args = (
        torch.randint(0, c.vocab, (1, 3), generator=g),
        torch.ones(1, 5, dtype=torch.int64),
        torch.randn(cache, generator=g),
        torch.randn(cache, generator=g),
    )
    return export(
        prefill,
        args,
        path,
        dynamo=False,
        opset=opset,
        input_names=INPUTS,
        output_names=OUTPUTS,
        dynamic_axes=PREFILL_AXES,
    )


def export_decode(style: str, path: str | Path, *, dynamo: bool, opset: int = 18):
    """The step of ``style`` exported with a dynamic past (``DYNAMIC_AXES``)."""
    return export_step(model(style), path, dynamo=dynamo, opset=opset)


def export_step(step: DecodeStep, path: str | Path, *, dynamo: bool, opset: int = 18):
    """``step`` exported with a dynamic past (``DYNAMIC_AXES``)."""
    axes = {k: v for k, v in DYNAMIC_AXES.items() if k in INPUTS or not dynamo}
    return export(
        step,
        example_inputs(step.c, 4),
        path,
        dynamo=dynamo,
        opset=opset,
        input_names=INPUTS,
        output_names=OUTPUTS,
        dynamic_axes=axes,
    )


def greedy_reference(style: str, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens from the torch step itself (the cache grown by concat)."""
    step = model(style)
    c = step.c
    past_k = torch.zeros(c.layers, 1, c.kv_heads, 0, c.head_dim)
    past_v = torch.zeros_like(past_k)
    out, token = [], None
    with torch.no_grad():
        for i in range(len(prompt) + new_tokens - 1):
            token = prompt[i] if i < len(prompt) else token
            mask = torch.ones(1, past_k.shape[3] + 1, dtype=torch.int64)
            logits, past_k, past_v = step(torch.tensor([[token]]), mask, past_k, past_v)
            if i >= len(prompt) - 1:
                token = int(np.argmax(logits[0, -1].numpy()))
                out.append(token)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("style", choices=STYLES)
    p.add_argument("out", type=Path)
    p.add_argument("--dynamo", action="store_true", help="torch.export (default: TorchScript)")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument(
        "--prefill",
        action="store_true",
        help="the prompt step instead: seq new tokens at once (TorchScript)",
    )
    args = p.parse_args(argv)
    if args.prefill and args.dynamo:
        p.error("--prefill is exported by TorchScript only")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.prefill:
        export_prefill(args.style, args.out, opset=args.opset)
    else:
        export_decode(args.style, args.out, dynamo=args.dynamo, opset=args.opset)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
