"""`make hf-check`: Hugging Face architectures through `orchestrate optimize`.

    python -m examples.hf_models [--models bert gpt2 ...] [--out out/hf] [--range 1..8x2..64]

Each architecture is built by ``transformers`` from a small config with random
weights (no download: ``HF_HUB_OFFLINE=1``), wrapped so that ``forward`` takes
one tensor and returns ``last_hidden_state``, exported with both torch
exporters, then optimized and verified against onnxruntime (two random
trials, fp32, rtol 1e-4).  One table row per model and exporter; a model torch
cannot export is reported as such, not counted as ours.  Exit status 1 if any
exported model fails to optimize or verify.

With ``--range`` (token models only), each is exported with dynamic batch and
sequence axes and optimized once for the range (``--shape x=RANGE``): the
bundle is verified at MIN, OPT, MAX and two random shapes between, and the
predicted time at OPT is compared with a static plan for that shape.

``transformers`` is not a dependency of orchestrate: the Makefile target
installs it into .venv first (it does not pull torch).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    # the dynamo exporter imports triton; without a GPU it must come up in
    # interpreter mode, which is fixed at its first import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import orchestrate  # noqa: E402
from examples.export import ExportError, export  # noqa: E402

SEQ, IMAGE, VOCAB, MELS = 16, 32, 256, 16
LM = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
GQA = dict(LM, num_key_value_heads=2)


def _architectures(t) -> dict[str, tuple[Callable[[], torch.nn.Module], str]]:
    """name -> (builder, input kind); ``t`` is the transformers module."""
    stages = dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])
    return {
        "bert": (lambda: t.BertModel(t.BertConfig(**LM)), "ids"),
        "roberta": (lambda: t.RobertaModel(t.RobertaConfig(**LM, pad_token_id=1)), "ids"),
        "distilbert": (
            lambda: t.DistilBertModel(
                t.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=VOCAB)
            ),
            "ids",
        ),
        "gpt2": (
            lambda: t.GPT2Model(
                t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64)
            ),
            "ids",
        ),
        "llama": (lambda: t.LlamaModel(t.LlamaConfig(**GQA)), "ids"),
        "mistral": (lambda: t.MistralModel(t.MistralConfig(**GQA)), "ids"),
        "qwen2": (lambda: t.Qwen2Model(t.Qwen2Config(**GQA)), "ids"),
        "gemma": (lambda: t.GemmaModel(t.GemmaConfig(**GQA, head_dim=16)), "ids"),
        "phi": (lambda: t.PhiModel(t.PhiConfig(**LM)), "ids"),
        "clip-text": (lambda: t.CLIPTextModel(t.CLIPTextConfig(**LM)), "ids"),
        "t5-encoder": (
            lambda: t.T5EncoderModel(
                t.T5Config(
                    d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=VOCAB
                )
            ),
            "ids",
        ),
        "whisper-encoder": (
            lambda: (
                t.WhisperModel(
                    t.WhisperConfig(
                        d_model=64,
                        encoder_layers=2,
                        decoder_layers=1,
                        encoder_attention_heads=4,
                        decoder_attention_heads=4,
                        encoder_ffn_dim=128,
                        decoder_ffn_dim=128,
                        num_mel_bins=MELS,
                        max_source_positions=SEQ,
                        max_target_positions=SEQ,
                        vocab_size=VOCAB,
                        pad_token_id=0,
                        bos_token_id=1,
                        eos_token_id=2,
                        decoder_start_token_id=1,
                    )
                ).encoder
            ),
            "audio",
        ),
        "vit": (
            lambda: t.ViTModel(
                t.ViTConfig(
                    hidden_size=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=128,
                    image_size=IMAGE,
                    patch_size=8,
                )
            ),
            "image",
        ),
        "convnext": (
            lambda: t.ConvNextModel(t.ConvNextConfig(**stages, image_size=IMAGE)),
            "image",
        ),
        "resnet": (lambda: t.ResNetModel(t.ResNetConfig(**stages, embedding_size=16)), "image"),
    }


class LastHidden(torch.nn.Module):
    """The model called on one tensor, returning its last hidden state."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return out[0] if isinstance(out, tuple) else out.last_hidden_state


def _example(kind: str) -> torch.Tensor:
    if kind == "ids":
        return torch.randint(0, VOCAB, (1, SEQ))
    if kind == "audio":  # log-mel features: two frames per encoder position (stride-2 conv)
        return torch.randn(1, MELS, 2 * SEQ)
    return torch.randn(1, 3, IMAGE, IMAGE)


def check(name: str, build, kind: str, dynamo: bool, out: Path) -> tuple[list[str], bool]:
    """One table row and whether it passed (an export failure is not ours)."""
    exporter = "dynamo, opset 18" if dynamo else "torchscript, opset 17"
    torch.manual_seed(0)
    src = out / f"{name}_{'dynamo' if dynamo else 'torchscript'}.onnx"
    try:
        with torch.no_grad():  # as for inference (T5's dynamo export needs it)
            model = export(
                LastHidden(build().eval()),
                [_example(kind)],
                src,
                dynamo=dynamo,
                opset=18 if dynamo else 17,
                input_names=["x"],
                output_names=["y"],
            )
    except ExportError as e:
        reason = str(e).split("export failed: ")[-1].splitlines()[0][:70]
        return [name, exporter, "-", "-", "-", "-", "-", f"torch cannot export: {reason}"], True
    started = time.perf_counter()
    try:
        result = orchestrate.optimize(src, src.with_suffix(".orch"), trials=2, rtol=1e-4)
    except orchestrate.OrchestrateError as e:
        failed = f"FAILED: {e}"
        return [name, exporter, str(len(model.graph.node)), "-", "-", "-", "-", failed], False
    plan, worst = result.plan, max(c.rel for c in result.report.checks)
    s, g = plan.summary, plan.baselines["greedy"]
    return [
        name,
        exporter,
        str(len(model.graph.node)),
        f"{g.kernels} / {s.kernels}",
        f"{g.predicted_us:.1f} / {s.predicted_us:.1f}",
        _in_attention(plan),
        f"{worst:.1e}",
        f"verified ({time.perf_counter() - started:.0f} s)",
    ], True


def check_range(name: str, build, dynamo: bool, out: Path, rng: str) -> tuple[list[str], bool]:
    """One row for a dynamic export optimized once for ``rng`` (``--range``)."""
    exporter = "dynamo, opset 18" if dynamo else "torchscript, opset 17"
    torch.manual_seed(0)
    src = out / f"{name}_{'dynamo' if dynamo else 'torchscript'}_dynamic.onnx"
    try:
        with torch.no_grad():
            # batch 2: torch.export refuses an example whose dynamic dimension is 1
            example = torch.randint(0, VOCAB, (2, SEQ))
            export(
                LastHidden(build().eval()),
                [example],
                src,
                dynamo=dynamo,
                opset=18 if dynamo else 17,
                input_names=["x"],
                output_names=["y"],
                dynamic_axes={"x": {0: "batch", 1: "sequence"}},
            )
    except ExportError as e:
        reason = str(e).split("export failed: ")[-1].splitlines()[0][:70]
        return [name, exporter, rng, "-", "-", "-", f"torch cannot export: {reason}"], True
    started = time.perf_counter()
    try:
        result = orchestrate.optimize(
            src, src.with_suffix(".orch"), shapes={"x": rng}, trials=2, rtol=1e-4
        )
    except orchestrate.OrchestrateError as e:
        return [name, exporter, rng, "-", "-", "-", f"FAILED: {e}"], False
    from orchestrate.plan import pipeline

    opt = result.family.at("opt")
    graph = pipeline.fission_model(pipeline.load(src), {"x": opt}, str(src))
    static = pipeline.plan_graph(graph).plan.summary.predicted_us
    dyn = result.plan.summary.predicted_us
    worst = max(c.rel for c in result.report.checks)
    shapes = "; ".join(result.report.bindings)
    ok = dyn <= 1.10 * static
    return [
        name,
        exporter,
        rng,
        f"{dyn:.1f} / {static:.1f} ({dyn / static:.3f}x)",
        shapes,
        f"{worst:.1e}",
        ("verified" if ok else "SLOWER THAN 1.10x STATIC")
        + f" ({time.perf_counter() - started:.0f} s)",
    ], ok


def _in_attention(plan) -> str:
    """Softmaxes (row maxima) inside attention kernels / all of them."""
    maxima = {p.name for p in plan.primitives if p.op == "reduce_max"}
    inside = {p for k in plan.kernels if k.template == "attention" for p in k.primitives}
    return f"{len(maxima & inside)} / {len(maxima)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="a subset of the architectures")
    parser.add_argument("--out", type=Path, default=Path("out/hf"))
    parser.add_argument(
        "--range",
        default=None,
        metavar="BxS",
        help="dynamic batch x sequence range for the token models, e.g. 1..8x2..64",
    )
    args = parser.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print(
            "hf_models: transformers is not installed (make hf-check installs it)", file=sys.stderr
        )
        return 2
    archs = _architectures(transformers)
    unknown = sorted(set(args.models or ()) - set(archs))
    if unknown:
        print(
            f"hf_models: unknown model(s) {', '.join(unknown)} (known: {', '.join(archs)})",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.range:
        return _main_range(archs, args, transformers.__version__)
    head = [
        "model",
        "exporter",
        "ONNX nodes",
        "kernels greedy / ILP",
        "predicted us greedy / ILP",
        "softmax in attention",
        "worst rel. error",
        "result",
    ]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, random weights\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)
    ok = True
    for name, (build, kind) in archs.items():
        if args.models and name not in args.models:
            continue
        for dynamo in (False, True):
            print(f"{name} ({'dynamo' if dynamo else 'torchscript'}) ...", file=sys.stderr)
            row, passed = check(name, build, kind, dynamo, args.out)
            ok &= passed
            print("| " + " | ".join(row) + " |", flush=True)
    return 0 if ok else 1


def _main_range(archs, args, version: str) -> int:
    head = [
        "model",
        "exporter",
        "range",
        "predicted us at OPT: dynamic / static",
        "shapes verified",
        "worst rel. error",
        "result",
    ]
    print(f"transformers {version}, torch {torch.__version__}, random weights\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)
    ok = True
    for name, (build, kind) in archs.items():
        if kind != "ids" or (args.models and name not in args.models):
            continue
        for dynamo in (False, True):
            print(f"{name} ({'dynamo' if dynamo else 'torchscript'}) ...", file=sys.stderr)
            row, passed = check_range(name, build, dynamo, args.out, args.range)
            ok &= passed
            print("| " + " | ".join(row) + " |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
