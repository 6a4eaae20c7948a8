"""The on-chip fit model against the compiler, and the fit check through the planner.

Every template x launch configuration the examples use is compiled for sm_90
with the real Triton compiler (no GPU needed); the model's shared-memory
figure (``kernels/fit.py``) must be at least the compiled kernel's
``metadata.shared`` (or the kernel could fail to launch where the model
said it fits) and at most twice it (or good kernels would be refused).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrate.ir.precision import lower_precision
from orchestrate.kernels.spec import (
    ATTENTION,
    MERGED_MATMUL,
    NORM_MATMUL,
    NORM_MERGED_MATMUL,
    SCRATCH_DTYPES,
    VIEW,
)
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.templates import working_set
from tests import graphs
from tests.compile_util import compile_sm90
from tests.emit_util import spec_of
from tests.templates.test_attention import attention_fn
from tests.util import has_nvidia_backend

ROOT = Path(__file__).resolve().parents[2]
# bytes of spill stores + loads a planned kernel may have (the fit model's
# documented miss: fp16 matmul and attention spills of at most 0.6 KB)
SPILL_TOLERANCE = 1024


def _conv_bias(b, x, w, bias):
    y = b.conv(x, w, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
    return b.add(y, bias)


def _graphs(tmp_path: Path):
    """The example models, plus graph-built kernels at base sizes (full tiles)."""
    from examples import export_example

    bert = pipeline.fission_file(ROOT / "examples/models/tiny_bert.onnx")
    yield "tiny_bert", bert
    # --dtype fp16: half activations beside fp32 statistics and parameters
    yield "tiny_bert_float16", lower_precision(bert, "fp16")
    for name in ("resnet", "llama"):
        src = tmp_path / f"{name}.onnx"
        export_example(name, src, dynamo=False, opset=17, size="tiny")
        yield name, pipeline.fission_file(src)
    yield "resnet_float16", lower_precision(pipeline.fission_file(tmp_path / "resnet.onnx"), "fp16")
    # a UNet stem (K = 27 in one step) and a ResNet stage-4 conv (K = 4,608)
    yield (
        "conv_stem_float32",
        graphs.build(_conv_bias, [(1, 3, 256, 256), (64, 3, 3, 3), (64, 1, 1)]),
    )
    yield (
        "conv_deep_float16",
        graphs.build(_conv_bias, [(1, 512, 7, 7), (512, 512, 3, 3), (512, 1, 1)], dtype="float16"),
    )
    for dtype in ("float32", "float16"):
        yield (
            f"mlp_{dtype}",
            graphs.build(graphs.mlp, [(128, 768), (768, 3072), (3072,), (3072, 768)], dtype=dtype),
        )
        yield (
            f"attention_{dtype}",
            graphs.build(attention_fn(scale=0.125), [(1, 4, 128, 64)] * 3, dtype=dtype),
        )
        for d in (128, 256):  # Llama-class and Gemma-class heads, keys in several steps
            yield (
                f"attention_d{d}_{dtype}",
                graphs.build(attention_fn(scale=d**-0.5), [(1, 2, 512, d)] * 3, dtype=dtype),
            )
        yield (
            f"layernorm_{dtype}",
            graphs.build(graphs.layernorm, [(128, 768), (768,), (768,)], dtype=dtype),
        )


def _kernels(tmp_path: Path):
    """One planned kernel per (template, operand dtype, launch configuration)."""
    seen = {}
    for label, g in _graphs(tmp_path):
        planned = plan(g, PlanOptions(device="h100", reproducible=True))
        for entry, spec in zip(planned.plan.kernels, planned.specs):
            if spec.template == VIEW:
                continue
            dtype = g.types[spec.inputs[0]].dtype
            key = (spec.template, dtype, spec.config)
            if key not in seen:
                seen[key] = (label, g, spec, entry.outputs)
    return list(seen.values())


@pytest.mark.skipif(not has_nvidia_backend(), reason="triton has no NVIDIA backend")
def test_the_shared_memory_model_brackets_the_compiled_kernels(tmp_path):
    kernels = _kernels(tmp_path)
    jobs = [
        (g, spec, writes, f"{spec.template}_{i}", label)
        for i, (label, g, spec, writes) in enumerate(kernels)
    ]
    compiled = compile_sm90(tmp_path, jobs, SCRATCH_DTYPES, timeout=900)
    templates = {spec.template for _, _, spec, _ in kernels}
    assert templates == {
        "pointwise",
        "row_reduce",
        "matmul",
        "conv",
        "window",
        ATTENTION,
        MERGED_MATMUL,
        NORM_MATMUL,
        NORM_MERGED_MATMUL,
    }
    bad, spilled = [], []
    for (label, g, spec, _), (shared, spill) in zip(kernels, compiled):
        if spill is not None and spill > SPILL_TOLERANCE:
            spilled.append(f"{label} {spec.template} {spec.config}: spills {spill} B")
        model = working_set(g, spec).shared_bytes
        # fp16 attention whose key loop is not pipelined: Triton's allocator
        # reuses its buffers unevenly, and the model can only bound it (the
        # README says so): up to 4x
        loose = (
            spec.template == ATTENTION
            and "float16" in label
            and (
                spec.config.num_stages < 2
                or g.producer[spec.roles.m1].shape[-1] <= spec.config["BLOCK_N"]
            )
        )
        if not (shared <= model <= (4 if loose else 2) * shared):
            bad.append(
                f"{label} {spec.template} {spec.config}: model {model} B, compiled {shared} B"
            )
    assert not bad, f"{len(bad)} of {len(kernels)} outside [1x, 2x]:\n" + "\n".join(bad)
    # what the planner picked, the spill rule let through: at most a few spilled words
    assert not spilled, "planned kernels that spill:\n" + "\n".join(spilled)


# -- the fit check is the rules' own: it decides what the planner may pick ------------------


def test_a_head_dim_that_fits_no_tile_gets_no_attention_kernel(tmp_path):
    """Head dim 1024 in fp16 on a GPU with 99 KB of shared memory per block:
    even 16 x 16 tiles do not fit, so the plan has no attention kernel, and
    `explain --rejected` says why; an H100's 227 KB hold them."""
    from click.testing import CliRunner

    from orchestrate import cli

    fn = attention_fn(scale=0.03)
    g = graphs.build(fn, [(1, 1, 64, 1024)] * 3, dtype="float16")
    p = plan(g, PlanOptions(device="l4", reproducible=True)).plan
    assert ATTENTION not in {k.template for k in p.kernels}
    assert any(d.rule == ATTENTION and "shared memory" in d.reason for d in p.declined)
    big = plan(g, PlanOptions(device="h100", reproducible=True)).plan  # 227 KB: it fits
    assert ATTENTION in {k.template for k in big.kernels}
    path = tmp_path / "plan.json"
    pipeline.write_plan(p, path)
    r = CliRunner().invoke(cli.main, ["explain", str(path), "--rejected"])
    assert r.exit_code == 0, r.output
    assert "rules that matched but declined" in r.output and "shared memory" in r.output


def test_smaller_shared_memory_gets_smaller_attention_tiles():
    """Head dim 256 in fp16 fits an H100 block with the default tiles and a
    99 KB block only with fewer stages or keys per step."""
    g = graphs.build(attention_fn(), [(1, 2, 128, 256)] * 3, dtype="float16")
    names = [n.name for n in g.nodes]
    big, small = spec_of(g, names, "h100"), spec_of(g, names, "l4")

    def area(s):
        return s.config["BLOCK_M"] * s.config["BLOCK_N"] * s.config.num_stages

    assert area(small) < area(big)
    assert working_set(g, small).shared_bytes <= 99 * 1024 < working_set(g, big).shared_bytes
