"""The attention kernel across the matrix of issue 12: every mask form
exporters write (none, causal as -inf / lowest-float / Where / built from
Range, padding from an input, padding with causal and fully masked rows,
sliding window), grouped-query heads (repeat_kv's Expand and broadcasting),
sequence lengths that are not multiples of the block, head dims 64, 128 and
256, and fp32, ``--dtype fp16`` and models written in fp16.

Each case is an ONNX model (``tests/attention_models.py``) taken through the
frontend and fission, planned for an H200 by the planner, which must put
every softmax (and the NaN guard) inside an ``attention`` kernel; the plan's
kernels then run in Triton's interpreter, with query and key blocks of 16 so
17, 33 and 40 leave partial blocks, and are compared with the reference
executor in float64.

Tolerances: fp32 kernels compute in IEEE fp32 against a float64 reference:
rtol 1e-5, atol 1e-6 (the largest error measured over all 241 cases,
over the output's largest magnitude: 1.2e-6, at head dim 256).  fp16: the
inputs are rounded to fp16 before both run, so what is left is the
kernel's own rounding (P to fp16 for the second dot, O to fp16 when
stored: 2**-11 each): rtol and atol 2e-3 (measured at most 4.3e-4 of the
output's scale; 1e-3 of a single element).

The default tier covers every value of every axis and the risky pairs
(head dim 256 with fp16 and masks, grouped-query heads with causal masks,
odd lengths with padding masks); ``-m slow`` runs the product of masks,
head dims, dtypes and head layouts.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from orchestrate.ir import Op, precision, reference
from orchestrate.kernels.spec import ATTENTION
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions, plan
from tests.attention_models import MASKS, Case, inputs, model
from tests.emit_util import run_plan

TOLERANCE = {"fp32": (1e-5, 1e-6), "fp16": (2e-3, 2e-3), "fp16_model": (2e-3, 2e-3)}

C = Case
CASES = [
    # masks, fp32
    C("none", 17, 64),
    C("causal_inf", 33, 64),
    C("causal_min", 17, 128),
    C("causal_where", 40, 64),
    C("causal_range", 33, 64),
    C("padding", 33, 64, batch=2),
    C("padding_causal", 17, 64, batch=2),
    C("padding_causal", 33, 64, batch=2, guard=True),
    C("sliding", 40, 128),
    # grouped-query heads with causal masks; the scale in each exported form
    C("causal_min", 33, 64, kv_heads=1),
    C("causal_where", 33, 64, kv_heads=1, gqa="broadcast"),
    C("none", 17, 64, scale="div"),
    C("causal_where", 17, 64, scale="split"),
    # head dim 256 in fp32 (its IEEE dots fit only 16 x 16 tiles at 8 warps)
    C("causal_inf", 17, 256),
    C("padding", 33, 256, batch=2),
    # fp16: --dtype fp16 and a model written in fp16
    C("none", 17, 64, "fp16"),
    C("causal_min", 33, 256, "fp16"),
    C("padding", 17, 256, "fp16", batch=2),
    C("sliding", 40, 256, "fp16_model"),
    C("causal_where", 33, 256, "fp16_model", kv_heads=1),
    C("causal_min", 33, 128, "fp16_model", kv_heads=1),
    C("padding_causal", 33, 64, "fp16", kv_heads=1, gqa="broadcast", guard=True, batch=2),
    C("causal_range", 40, 128, "fp16"),
    C("padding", 17, 128, "fp16_model", batch=2, scale="split"),
]


def planned(case: Case):
    """The case's primitive graph (at its dtype) and the planner's plan for an H200."""
    g = pipeline.fission_model(model(case), None, case.id)
    dtype = "fp16" if case.dtype == "fp16" else None
    g = precision.lower_precision(g, dtype)
    return g, plan(g, PlanOptions(device="h200", dtype=dtype, reproducible=True))


def check(case: Case) -> float:
    """Plan, check that every softmax is inside an attention kernel, run and
    compare with the reference; the largest error over the output's scale."""
    g, p = planned(case)
    softmaxes = {n.name for n in g.nodes if n.op in (Op.RMAX, Op.ISNAN)}
    inside = {n for k in p.plan.kernels if k.template == ATTENTION for n in k.primitives}
    reasons = [d.reason for d in p.plan.declined]
    assert softmaxes and softmaxes <= inside, (case.id, sorted(softmaxes - inside), reasons)
    assert any(n.op is Op.ISNAN for n in g.nodes) == case.guard
    x = inputs(case)
    with np.errstate(invalid="ignore"):  # fully masked rows: 0 / 0 in the reference
        got, _ = run_plan(g, p, x)
        want = reference.run(g, x, float64=True)["out"]
    out = got["out"]
    assert out.dtype == np.dtype(g.types["out"].dtype)
    rtol, atol = TOLERANCE[case.dtype]
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=atol, err_msg=case.id)
    rows_nan = np.isnan(want).any(-1)
    assert rows_nan.any() == (case.fully_masked_rows and not case.guard), case.id
    finite = ~np.isnan(want)
    return float(np.max(np.abs(out[finite] - want[finite])) / np.max(np.abs(want[finite])))


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_attention_matches_the_reference(case):
    check(case)


def test_the_default_tier_covers_every_value_of_every_axis():
    for axis, values in (
        ("mask", MASKS),
        ("head_dim", (64, 128, 256)),
        ("seq", (17, 33, 40)),
        ("dtype", tuple(TOLERANCE)),
        ("gqa", ("expand", "broadcast")),
        ("scale", ("mul", "div", "split")),
    ):
        cases = [c for c in CASES if axis != "gqa" or c.kv_heads == 1]
        assert {getattr(c, axis) for c in cases} == set(values), axis
    # the risky pairs
    assert any(c.head_dim == 256 and c.dtype != "fp32" and c.mask != "none" for c in CASES)
    assert any(c.kv_heads == 1 and c.mask.startswith("causal") for c in CASES)
    assert any(c.seq % 16 and c.mask.startswith("padding") for c in CASES)


SLOW = [
    Case(
        mask,
        (17, 33, 40)[(i + i // 3) % 3],
        d,
        dtype,
        kv_heads=1 if gqa else 2,
        gqa=gqa or "expand",
        batch=2 if mask.startswith("padding") else 1,
        guard=mask == "padding_causal",
    )
    for i, (mask, d, dtype, gqa) in enumerate(
        itertools.product(MASKS, (64, 128, 256), tuple(TOLERANCE), (None, "expand", "broadcast"))
    )
]


@pytest.mark.slow
@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("case", SLOW, ids=lambda c: c.id)
def test_attention_matrix_product(case):
    check(case)


# -- on chip: large head dims compiled for the device they were planned for -------------------


def test_large_head_dims_compile_within_the_device_limits(tmp_path):
    """Causal attention over 2048 keys (full tiles, many key steps) with
    head dims 128 and 256 in fp16 and 256 in fp32, optimized for an H200,
    and head dim 256 in fp16 for an L4 (99 KB of shared memory a block,
    where it gets smaller tiles): each attention kernel compiles for its
    device (sm_90, sm_89) within the device's limits, spilling at most the
    fit model's documented miss (head dim 256 fp16 on the H200, 64 x 64
    tiles at 8 warps: 255 registers and 8 B of spills)."""
    import onnx

    import orchestrate
    from tests.check.test_compile_check import _compile_check
    from tests.templates.test_fit import SPILL_TOLERANCE
    from tests.util import has_nvidia_backend

    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    bundles = []
    for d, dtype, device in (
        (128, "fp16", "h200"),
        (256, "fp16", "h200"),
        (256, "fp32", "h200"),
        (256, "fp16", "l4"),
    ):
        path = tmp_path / f"causal-d{d}.onnx"
        onnx.save(model(Case("causal_min", 2048, d)), path)
        result = orchestrate.optimize(
            path,
            tmp_path / f"{path.stem}-{dtype}-{device}.orch",
            device=device,
            dtype=dtype,
            trials=0,
            # fp32 at head dim 256 is priced faster unfused (CUDA-core matmuls at
            # 0.75 of peak against attention's 0.4); no scores in memory forces it
            memory_budget=1 if dtype == "fp32" else None,
        )
        assert [k.template for k in result.plan.kernels].count(ATTENTION) == 1
        bundles.append((result.path, device))
    run = _compile_check(*(str(b) for b, _ in bundles), "--json")
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("no ptxas to compile with")
    assert run.returncode == 0, run.stderr[-4000:]
    rows = json.loads(run.stdout)
    print(
        *(
            f"{r['bundle'].rsplit('/', 1)[-1]} {r['kernel']}: {r['shared_bytes']} B shared, "
            f"{r['registers']} registers, {r['spill_bytes']} B spilled"
            for r in rows
        ),
        sep="\n",
    )
    for folder, device in bundles:
        mine = [r for r in rows if r["bundle"] == str(folder)]
        assert any(r["kernel"].startswith(ATTENTION) for r in mine), mine
        assert all(
            r["device"] == device and r["arch"] == (90 if device == "h200" else 89) for r in mine
        )
        assert all(r["within_limits"] and r["spill_bytes"] <= SPILL_TOLERANCE for r in mine), [
            {k: r[k] for k in ("kernel", "shared_bytes", "registers", "spill_bytes", "violations")}
            for r in mine
        ]
