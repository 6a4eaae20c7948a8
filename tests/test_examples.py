"""The example models: export with both torch exporters at several opsets,
check the export against torch, then decompose and compare with onnxruntime.

Each case is (example, exporter, opset, dynamic axes or not).  A dynamic
export is run at batch 3 / sequence 13, sizes it was not traced with, so the
shapes check_decomposition passes to ``prepare`` are what makes it static (the
``--shape`` path).  Every case is exported once per test process.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import pytest
import torch

from examples import EXAMPLES, ExportError, build_model, export, export_example, random_inputs
from examples.build import main as build_main
from examples.suite import SUITE
from examples.suite import main as suite_main
from orchestrate.frontend import onnxrt
from tests.util import check_decomposition

MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"


class Case(NamedTuple):
    example: str
    dynamo: bool
    opset: int
    dynamic: bool

    @property
    def id(self) -> str:
        kind = "dynamo" if self.dynamo else "torchscript"
        return f"{self.example}-{kind}-{self.opset}" + ("-dynamic" if self.dynamic else "")


def case(example, dynamo, opset, dynamic=False, slow=False):
    c = Case(example, dynamo, opset, dynamic)
    return pytest.param(c, id=c.id, marks=[pytest.mark.slow] if slow else [])


# Every example with both exporters; opsets 14..20 spread over the cases
# (the dynamo exporter builds opset 18 and converts: 17 down, 19/20 up).
CASES = [
    case("bert", False, 17),
    case("bert", False, 14, dynamic=True),
    case("bert", True, 18, dynamic=True),
    case("bert", True, 17, slow=True),
    case("gpt2", False, 15, dynamic=True),
    case("gpt2", True, 18),
    case("gpt2", False, 20, slow=True),
    case("vit", False, 16),
    case("vit", True, 19, dynamic=True),
    case("llama", False, 17),
    case("llama", True, 18, dynamic=True),
    case("llama", True, 20, slow=True),
    case("mistral", False, 14, dynamic=True),
    case("mistral", True, 18),
    case("t5", False, 17, dynamic=True),
    case("t5", True, 18),
    case("t5", True, 20, dynamic=True, slow=True),
    case("torch_encoder", False, 17),
    case("torch_encoder", True, 18, dynamic=True),
    case("resnet", False, 14),
    case("resnet", True, 18, dynamic=True),
    case("resnet", False, 20, dynamic=True, slow=True),
    case("mobilenet", False, 15, dynamic=True),
    case("mobilenet", True, 20),
    case("unet", False, 17),
    case("unet", True, 17, dynamic=True),
    case("unet", False, 19, dynamic=True, slow=True),
    case("inception", False, 14),
    case("inception", True, 18, dynamic=True),
    case("inception", False, 20, dynamic=True, slow=True),
    # the benchmark suite's models (examples.suite) beyond the ones above
    case("resnet50", False, 17),
    case("resnet50", True, 18, dynamic=True, slow=True),
    case("convnext", False, 17),
    case("convnext", True, 18, dynamic=True),
    case("segformer", False, 17),
    case("segformer", True, 18, dynamic=True, slow=True),
    case("style_transfer", False, 17),
    case("style_transfer", True, 18, dynamic=True),
    case("yolo", False, 17),
    case("yolo", True, 18, dynamic=True, slow=True),
]

# Run-time sizes of dynamic axes: not the traced 2 / 16, not powers of two.
DYNAMIC_SIZES = {"batch": 3, "sequence": 13}

# (rtol, atol) against onnxruntime.  fp32 throughout; the logits of the
# LM-head models reach |50| (random N(0, 1) embeddings), hence their atol.
TOLERANCE = {"gpt2": (1e-5, 1e-4), "llama": (1e-5, 1e-4), "mistral": (1e-5, 1e-4)}
DEFAULT_TOLERANCE = (1e-5, 1e-5)


_EXPORTS: dict[Case, tuple[onnx.ModelProto, tuple]] = {}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """case -> (ONNX model, inputs), exported on first use."""

    def get(c: Case):
        if c not in _EXPORTS:
            path = tmp_path_factory.mktemp("export") / f"{c.id}.onnx"
            _EXPORTS[c] = export_example(
                c.example, path, dynamo=c.dynamo, opset=c.opset, dynamic=c.dynamic
            )
        return _EXPORTS[c]

    return get


def feeds_for(c: Case, inputs, seed: int = 0) -> dict[str, np.ndarray]:
    shapes = None
    if c.dynamic:
        shapes = {}
        for i in inputs:
            named = dict(i.dynamic)
            shapes[i.name] = tuple(
                DYNAMIC_SIZES[named[a]] if a in named else d for a, d in enumerate(i.shape)
            )
    return random_inputs(inputs, seed, shapes)


def torch_outputs(name: str, inputs, feeds) -> list[np.ndarray]:
    model, _ = build_model(name)
    with torch.no_grad():
        out = model(*(torch.from_numpy(feeds[i.name]) for i in inputs))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("c", CASES)
def test_export_matches_torch(c: Case, exported):
    """The exported file runs in onnxruntime and computes what torch does;
    a dynamic export really has symbolic input dimensions."""
    model, inputs = exported(c)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert opset == c.opset
    symbolic = [
        d.dim_param
        for vi in model.graph.input
        for d in vi.type.tensor_type.shape.dim
        if not d.HasField("dim_value")
    ]
    assert bool(symbolic) == c.dynamic, symbolic
    feeds = feeds_for(c, inputs, seed=1)
    got = onnxrt.run(model, feeds)
    names = EXAMPLES[c.example].model.OUTPUTS
    assert [o.name for o in model.graph.output] == list(names)
    for name, want in zip(names, torch_outputs(c.example, inputs, feeds)):
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5 * scale, err_msg=name)


@pytest.mark.parametrize("c", CASES)
def test_decomposition_matches_onnxruntime(c: Case, exported):
    """Fission of the whole model leaves only primitives, and both the
    reference executor and the primitive model agree with onnxruntime."""
    model, inputs = exported(c)
    rtol, atol = TOLERANCE.get(c.example, DEFAULT_TOLERANCE)
    feeds = feeds_for(c, inputs, seed=2)
    check_decomposition(model, feeds, rtol=rtol, atol=atol)


# The ops that make each example what it is, per exporter: a refactor of the
# model code that loses one of them no longer tests what it claims to.
SIGNATURE_OPS = {
    ("bert", False, 17): {"Gather", "LayerNormalization", "Erf", "Softmax", "Tanh", "Sub"},
    ("bert", True, 18): {"Gather", "LayerNormalization", "Erf", "Softmax", "Tanh", "Shape"},
    ("gpt2", True, 18): {"Gather", "LayerNormalization", "Pow", "Tanh", "Where", "Split"},
    ("gpt2", False, 15): {"Range", "Pow", "Tanh", "Where", "Split", "ReduceMean", "Sqrt"},
    ("vit", False, 16): {"Conv", "Concat", "Erf", "ReduceMean", "Sqrt", "Softmax", "Gemm"},
    ("llama", True, 18): {
        "Pow",
        "ReduceMean",
        "Sqrt",
        "Reciprocal",
        "Neg",
        "Slice",
        "Concat",
        "Expand",
        "Sigmoid",
        "Trilu",
        "Where",
        "Range",
    },
    ("llama", False, 17): {
        "Pow",
        "ReduceMean",
        "Sqrt",
        "Div",
        "Neg",
        "Slice",
        "Concat",
        "Expand",
        "Sigmoid",
        "Trilu",
        "Where",
    },
    ("mistral", False, 14): {"LessOrEqual", "Less", "And", "Not", "Where", "Range"},
    ("t5", False, 17): {"Abs", "Log", "Less", "Min", "Where", "Relu", "ReduceMean", "Pow"},
    ("t5", True, 18): {"Relu", "ReduceMean", "Pow", "Reciprocal", "Sqrt", "Softmax"},
    ("torch_encoder", True, 18): {"LayerNormalization", "Softmax", "Relu", "Gemm"},
    ("resnet", False, 14): {
        "Conv",
        "Relu",
        "Add",
        "MaxPool",
        "GlobalAveragePool",
        "Flatten",
        "Gemm",
    },
    ("resnet", True, 18): {"Conv", "Relu", "Add", "MaxPool", "ReduceMean", "Gemm"},
    ("mobilenet", False, 15): {
        "Conv",
        "HardSwish",
        "HardSigmoid",
        "Clip",
        "Mul",
        "GlobalAveragePool",
    },
    ("unet", False, 17): {
        "Conv",
        "InstanceNormalization",
        "LeakyRelu",
        "AveragePool",
        "Resize",
        "Concat",
    },
    ("inception", False, 14): {"LRN", "Sum", "Pad", "Sigmoid", "MaxPool", "Concat", "Softmax"},
    ("inception", True, 18): {"Pad", "AveragePool", "Pow", "Sigmoid", "MaxPool", "Softmax"},
    ("resnet50", False, 17): {"Conv", "Relu", "Add", "MaxPool", "GlobalAveragePool", "Gemm"},
    ("convnext", False, 17): {
        "Conv",
        "Transpose",
        "LayerNormalization",
        "MatMul",
        "Erf",
        "Mul",
        "ReduceMean",
        "Gemm",
    },
    ("segformer", False, 17): {
        "Conv",
        "LayerNormalization",
        "MatMul",
        "Softmax",
        "Erf",
        "Resize",
        "Concat",
        "Relu",
    },
    ("style_transfer", False, 17): {
        "Pad",
        "Conv",
        "InstanceNormalization",
        "Relu",
        "Add",
        "Resize",
    },
    ("yolo", False, 17): {"Conv", "Sigmoid", "Mul", "Resize", "Concat", "MaxPool", "Add"},
}


def _case_of(key) -> Case:
    return next(p.values[0] for p in CASES if p.values[0][:3] == key)


@pytest.mark.parametrize("key", sorted(SIGNATURE_OPS), ids=lambda k: "-".join(map(str, k)))
def test_export_has_signature_ops(key, exported):
    model, _ = exported(_case_of(key))
    ops = Counter(n.op_type for n in model.graph.node)
    assert SIGNATURE_OPS[key] <= set(ops), sorted(SIGNATURE_OPS[key] - set(ops))


def test_export_attributes_that_matter(exported):
    """Depthwise grouping, dilation, both resize modes, reflect padding."""

    def attrs(c, op):
        model, _ = exported(c)
        return [
            {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            for n in model.graph.node
            if n.op_type == op
        ]

    mobilenet = attrs(_case_of(("mobilenet", False, 15)), "Conv")
    assert any(a.get("group", 1) > 1 for a in mobilenet)
    unet = _case_of(("unet", False, 17))
    assert any(a.get("dilations", [1])[0] == 2 for a in attrs(unet, "Conv"))
    assert {a["mode"] for a in attrs(unet, "Resize")} == {b"nearest", b"linear"}
    inception = _case_of(("inception", False, 14))
    assert {a.get("mode") for a in attrs(inception, "Pad")} >= {b"reflect"}
    assert any(a.get("pads", [0])[0] > 0 for a in attrs(_case_of(("resnet", False, 14)), "MaxPool"))


def test_suite_export_attributes_that_matter(exported):
    """ConvNeXt's depthwise 7x7; SegFormer's key/value reduction (a Conv whose
    stride is its kernel) and Mix-FFN depthwise 3x3; the style network's
    reflect padding; nearest upsampling in the YOLO neck."""

    def attrs(example, op):
        model, _ = exported(_case_of((example, False, 17)))
        return [
            {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            for n in model.graph.node
            if n.op_type == op
        ]

    def depthwise(a, k):
        return a.get("group", 1) > 1 and a["kernel_shape"] == [k, k]

    assert any(depthwise(a, 7) for a in attrs("convnext", "Conv"))
    segformer = attrs("segformer", "Conv")
    assert any(depthwise(a, 3) for a in segformer)
    assert any(a["strides"] == a["kernel_shape"] != [1, 1] for a in segformer)
    assert {a.get("mode") for a in attrs("style_transfer", "Pad")} == {b"reflect"}
    assert {a["mode"] for a in attrs("yolo", "Resize")} == {b"nearest"}


def test_dynamo_opset_that_cannot_be_reached_is_an_error(tmp_path):
    """The dynamo exporter keeps opset 18 when it cannot convert down (no
    LayerNormalization before 17); export says so instead of writing it."""
    with pytest.raises(ExportError, match="asked for opset 14"):
        export_example("torch_encoder", tmp_path / "m.onnx", dynamo=True, opset=14)


def test_invalid_dynamo_conversion_is_an_error(tmp_path):
    """Converting GPT-2's Split down to opset 17 keeps the opset-18
    ``num_outputs`` attribute: an invalid file, reported as such."""
    with pytest.raises(ExportError, match="invalid model.*num_outputs"):
        export_example("gpt2", tmp_path / "m.onnx", dynamo=True, opset=17)


def test_torchscript_dynamic_encoder_is_refused(tmp_path):
    with pytest.raises(ExportError, match="cannot make its axes dynamic"):
        export_example("torch_encoder", tmp_path / "m.onnx", dynamo=False, opset=17, dynamic=True)


class _GroupedQueryAttention(torch.nn.Module):
    def forward(self, q):
        k = q[:, :2]
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True)


def test_failed_torchscript_export_is_one_error_not_an_ir_dump(tmp_path, capfd):
    """The TorchScript exporter cannot convert grouped-query SDPA and, on any
    failure, prints its whole IR graph from native code; export keeps that off
    the terminal and raises ExportError with the reason."""
    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(ExportError, match="torchscript export failed: .*enable_gqa"):
        export(_GroupedQueryAttention(), [q], tmp_path / "m.onnx", dynamo=False, opset=17)
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err
    print("still printing")  # the descriptor is restored
    assert capfd.readouterr().out == "still printing\n"


def test_build_writes_models(tmp_path, capsys):
    assert build_main(["--out", str(tmp_path), "--only", "resnet", "inception"]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["tiny_inception.onnx", "tiny_resnet.onnx"]
    out = capsys.readouterr().out
    assert out.count("wrote ") == 2 and "tiny_resnet.onnx" in out
    onnx.checker.check_model(onnx.load(str(tmp_path / "tiny_resnet.onnx")))
    with pytest.raises(SystemExit):
        build_main(["--out", str(tmp_path), "--only", "nonexistent"])


def test_shipped_tiny_bert_is_what_build_writes(tmp_path):
    """examples/models/tiny_bert.onnx: small, static, opset 17, and the same
    function of its inputs as a fresh ``examples.build --only bert``."""
    shipped_path = MODELS / "tiny_bert.onnx"
    assert shipped_path.stat().st_size < 1 << 20
    shipped = onnx.load(str(shipped_path))
    onnx.checker.check_model(shipped)
    assert [o.version for o in shipped.opset_import if o.domain in ("", "ai.onnx")] == [17]
    dims = {
        vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in shipped.graph.input
    }
    assert dims == {"input_ids": [1, 16], "attention_mask": [1, 16]}
    assert build_main(["--out", str(tmp_path), "--only", "bert"]) == 0
    fresh = onnx.load(str(tmp_path / "tiny_bert.onnx"))
    _, inputs = build_model("bert")
    feeds = random_inputs(inputs, seed=3)
    want, got = onnxrt.run(fresh, feeds), onnxrt.run(shipped, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_tiny_configs_are_tiny():
    for name in EXAMPLES:
        model, _ = build_model(name)
        params = sum(p.numel() for p in model.parameters())
        assert params < 300_000, (name, params)


def test_suite_writes_tiny_models(tmp_path, capsys):
    """``make models ARGS=--tiny``, for two of the models: one line each."""
    assert suite_main(["--tiny", "--out", str(tmp_path), "--only", "resnet50", "yolo"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_resnet50.onnx", "tiny_yolo.onnx"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(" nodes, " in line for line in lines)


def test_suite_names_full_size_models():
    """Every suite entry is an example at a size it has; the new models'
    ``base`` are the real architectures (torchvision's parameter counts for
    ResNet-50 and ConvNeXt-T); the decoder has head dim 128 and four query
    heads per key/value head."""
    for name, size in SUITE:
        EXAMPLES[name].config(size)
    counts = {}
    for name in ("resnet50", "convnext", "segformer", "style_transfer", "yolo"):
        model, _ = build_model(name, "base")
        counts[name] = sum(p.numel() for p in model.parameters())
    assert counts["resnet50"] == 25_557_032
    assert counts["convnext"] == 28_589_128
    assert 3.6e6 < counts["segformer"] < 3.9e6  # SegFormer-B0: 3.8 M
    assert 1.6e6 < counts["style_transfer"] < 1.7e6  # fast_neural_style: 1.68 M
    assert 5e6 < counts["yolo"] < 10e6
    wide = EXAMPLES["llama"].config(dict(SUITE)["llama"])
    assert (wide.hidden, wide.layers, wide.hidden // wide.heads) == (2048, 4, 128)
    assert wide.heads == 4 * wide.kv_heads


@pytest.mark.slow
def test_planner_llama_has_about_1500_nodes(tmp_path):
    """The planner benchmark's 24-layer decoder: ~1,500 nodes from dynamo
    (the count does not depend on the widths, so they are shrunk here)."""
    config = EXAMPLES["llama"].config("base")
    assert config.layers == 24
    model, _ = export_example(
        "llama",
        tmp_path / "m.onnx",
        dynamo=True,
        opset=18,
        size="base",
        hidden=64,
        intermediate=128,
        vocab=1000,
        max_positions=256,
    )
    assert 1300 <= len(model.graph.node) <= 1700


@pytest.mark.slow
def test_bert_base_decomposition(tmp_path):
    """Real BERT-base sizes (12 layers, hidden 768, seq 128).  The absolute
    error grows to ~1e-5 on outputs of ~10 over twelve fp32 layers (the
    summation order of the matmuls differs), hence atol 1e-4."""
    model, inputs = export_example("bert", tmp_path / "m.onnx", dynamo=False, opset=17, size="base")
    check_decomposition(model, random_inputs(inputs, seed=2), rtol=1e-5, atol=1e-4)


def test_torch_local_response_norm(tmp_path):
    """TorchScript writes an If on a shape test; its condition is constant once
    shapes are bound and the frontend inlines the branch it takes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.LocalResponseNorm(5)).eval()
    image = torch.randn(1, 3, 12, 12)
    exported = export(
        model, [image], tmp_path / "m.onnx", dynamo=False, opset=17, input_names=["image"]
    )
    assert "If" in {n.op_type for n in exported.graph.node}
    check_decomposition(exported, {"image": image.numpy()})
