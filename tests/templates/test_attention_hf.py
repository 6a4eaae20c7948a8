"""The attention rule on what ``transformers`` and the torch exporters emit:
decoders through the SDPA path (grouped-query heads, rotary embeddings, a
causal or sliding-window mask folded to a constant, the NaN guard
``WHERE(ISNAN(P), 0, P)`` after the softmax), CLIP's causal text encoder and
a padding mask computed from an input in the kernel's prologue.  Each model is
built from a one-layer config with random weights, exported, optimized and
verified against onnxruntime (Triton's interpreter on a CPU); every softmax
must end up inside an ``attention`` kernel."""

from __future__ import annotations

import os

import pytest

from orchestrate.ir import Op
from orchestrate.kernels.spec import ATTENTION

torch = pytest.importorskip("torch")
t = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SEQ, VOCAB = 8, 256
LM = dict(
    hidden_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
GQA = dict(LM, num_key_value_heads=2)
CLIP = dict(LM, max_position_embeddings=SEQ)

MODELS = {
    "llama": lambda: t.LlamaModel(t.LlamaConfig(**GQA)),
    "mistral-sliding-window": lambda: t.MistralModel(t.MistralConfig(**GQA, sliding_window=4)),
    "qwen2": lambda: t.Qwen2Model(t.Qwen2Config(**GQA)),
    "gemma": lambda: t.GemmaModel(t.GemmaConfig(**GQA, head_dim=16)),
    "clip-text": lambda: t.CLIPTextModel(t.CLIPTextConfig(**CLIP)),
    "gpt2": lambda: t.GPT2Model(t.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=VOCAB)),
}


class Hidden(torch.nn.Module):
    """``last_hidden_state`` of the model on ids (and an attention mask)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, mask=None):
        return self.model(x, attention_mask=mask).last_hidden_state


def _optimized(tmp_path, name: str, dynamo: bool, padding: bool = False):
    import orchestrate
    from examples.export import export
    from orchestrate.plan import pipeline

    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (2 if padding else 1, SEQ))
    args, names = [x], ["x"]
    if padding:  # the second sequence ends after 5 tokens
        mask = torch.ones_like(x)
        mask[1, 5:] = 0
        args, names = [x, mask], ["x", "mask"]
    src = tmp_path / f"{name}.onnx"
    with torch.no_grad():
        export(
            Hidden(MODELS[name]().eval()),
            args,
            src,
            dynamo=dynamo,
            opset=18 if dynamo else 17,
            input_names=names,
            output_names=["y"],
        )
    result = orchestrate.optimize(src, tmp_path / "out", trials=1, rtol=1e-4, reproducible=True)
    assert result.report.ok and max(c.rel for c in result.report.checks) <= 1e-4
    graph = pipeline.fission_file(src)
    return graph, result.plan


def _assert_every_softmax_in_attention(graph, plan, guarded: bool):
    softmaxes = {n.name for n in graph.nodes if n.op is Op.RMAX}
    guards = {n.name for n in graph.nodes if n.op is Op.ISNAN}
    inside = {p for k in plan.kernels if k.template == ATTENTION for p in k.primitives}
    assert softmaxes and softmaxes <= inside, sorted(softmaxes - inside)
    assert bool(guards) == guarded and guards <= inside


@pytest.mark.parametrize("name", ["llama", "mistral-sliding-window", "qwen2", "gemma", "clip-text"])
def test_sdpa_decoders_and_clip_get_attention_kernels(tmp_path, name):
    """Dynamo export: grouped-query EXPANDs (not CLIP), a constant causal or
    sliding-window mask and the NaN guard, all inside the kernel."""
    graph, plan = _optimized(tmp_path, name, dynamo=True)
    _assert_every_softmax_in_attention(graph, plan, guarded=True)


def test_clip_text_torchscript(tmp_path):
    graph, plan = _optimized(tmp_path, "clip-text", dynamo=False)
    _assert_every_softmax_in_attention(graph, plan, guarded=False)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_padding_mask_from_an_input_runs_in_the_prologue(tmp_path, name):
    """The attention mask is an input: the chain making the additive mask from
    it (casts, EXPANDs, WHERE, the causal constant) is a score side input."""
    graph, plan = _optimized(tmp_path, name, dynamo=True, padding=True)
    _assert_every_softmax_in_attention(graph, plan, guarded=True)
    att = next(k for k in plan.kernels if k.template == ATTENTION)
    assert "mask" in att.inputs or any(i.startswith("mask") for i in att.inputs), att.inputs
