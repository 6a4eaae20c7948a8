"""The matmul generator against the reference executor, in the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrate import ir
from orchestrate.decompose.builder import Builder, Value
from orchestrate.emit import emit
from orchestrate.ir import reference, type_rules
from orchestrate.kernels import config
from orchestrate.kernels.spec import MATMUL, SPLIT_K_COUNTERS, KernelSpec
from orchestrate.run.runtime import Program, load_kernels
from tests import graphs
from tests.emit_util import (
    assert_matches_reference,
    one_kernel,
    one_source,
    plan_from_sets,
    spec_of,
)

dims = st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17])


@pytest.fixture
def small_tiles(monkeypatch):
    """Interpreter tiles of 16 and groups of 2 tile rows: several tiles, K steps
    and groups even for small shapes."""
    monkeypatch.setattr(config, "MATMUL_INTERPRET_BLOCK", 16)
    monkeypatch.setattr(config, "GROUP_M", 2)


def _matmul_kernel(g: ir.Graph):
    k = spec_of(g, [n.name for n in g.nodes])
    assert isinstance(k, KernelSpec) and k.template == MATMUL, k
    return k


@settings(max_examples=10, deadline=None)
@given(m=dims, k=dims, n=dims, seed=st.integers(0, 99))
def test_plain_matmul_any_size(m, k, n, seed):
    g = graphs.build(lambda b, x, y: b.matmul(x, y), [(m, k), (k, n)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g, seed), atol=1e-5)


def test_many_tiles_k_steps_and_groups(small_tiles):
    """37 x 41 output, K = 50: 3 x 3 tiles in groups of 2 rows, 4 K steps."""
    g = graphs.build(lambda b, x, y: b.matmul(x, y), [(37, 50), (50, 41)])
    src = assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), atol=1e-5)
    assert "BLOCK_M = 16" in src and "GROUP_M = 2" in src


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((2, 1, 5, 7), (3, 7, 4)),  # batch (2, 1) with (3,) -> (2, 3)
        ((3, 6, 5), (5, 9)),  # batched A, shared B
        ((1, 6, 5), (4, 5, 3)),  # size-1 batch of A broadcast
        ((2, 3, 1, 1), (1, 3, 1, 2)),  # M = K = 1
    ],
)
def test_batch_broadcasting(a_shape, b_shape):
    def fn(b, x, y, z):
        return b.add(b.matmul(x, y), z)

    out = type_rules.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])
    z_shape = (out[-1],)  # bias broadcast along every batch and row
    g = graphs.build(fn, [a_shape, b_shape, z_shape])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), atol=1e-5)


def test_transposed_operands_are_strided_loads(small_tiles):
    """A = x^T and B = y^T through TRANSPOSE prologues, no copies."""

    def fn(b, x, y):
        return b.matmul(b.transpose(x, (0, 2, 1)), b.transpose(y, (1, 0)))

    g = graphs.build(fn, [(2, 19, 23), (29, 19)])
    src = assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), atol=1e-5)
    assert src.count("tl.load(") == 2


def test_attention_scores_prologue():
    """q and k split into heads by RESHAPE + TRANSPOSE (k^T), scaled scores."""
    bsz, seq, heads, dh = 2, 7, 3, 5

    def fn(b, q, k, mask):
        def heads_of(t):
            return b.transpose(b.reshape(t, (bsz, seq, heads, dh)), (0, 2, 1, 3))

        kt = b.transpose(heads_of(k), (0, 1, 3, 2))
        s = b.mul(b.matmul(heads_of(q), kt), 1 / np.sqrt(dh))
        return b.add(s, mask)

    g = graphs.build(fn, [(bsz, seq, heads * dh), (bsz, seq, heads * dh), (1, 1, seq, seq)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), atol=1e-5)


def test_prologue_values_vanish_on_padded_k(small_tiles):
    """exp(x) @ exp(y) with K = 21: padded K columns of both tiles are 1 before
    masking; the kernel must zero them."""
    g = graphs.build(lambda b, x, y: b.matmul(b.exp(x), b.exp(y)), [(9, 21), (21, 11)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), rtol=1e-5, atol=1e-5)


def test_scale_and_cast_prologue():
    """fp32 inputs scaled and cast to fp16 on load, fp16 matmul, cast back."""

    def fn(b, x, y):
        a = b.cast(b.mul(x, 0.25), "float16")
        c = b.cast(y, "float16")
        return b.cast(b.matmul(a, c), "float32")

    g = graphs.build(fn, [(6, 20), (20, 10)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), rtol=5e-3, atol=5e-3)


def test_gather_and_pad_prologue():
    """Embedding lookup (negative ids) and a padded operand (fill 2.0) on load."""
    b = Builder()
    b.begin("g", "g")
    table = Value("table", ir.TensorType((10, 6), "float32"))
    ids = Value("ids", ir.TensorType((5,), "int64"))
    w = Value("w", ir.TensorType((5, 3), "float32"))
    e = b.gather(table, ids, 0)  # (5, 6)
    wp = b.pad(w, (1, 0, 0, 1), "constant", 2.0)  # (6, 4): a row and a column of 2.0
    out = b.matmul(e, wp)
    g = ir.Graph(
        tuple(b.nodes),
        tuple(ir.Input(v.name, v.type) for v in (table, ids, w)),
        (out.name,),
        b.constants,
    )
    rng = np.random.default_rng(3)
    inputs = {
        "table": rng.standard_normal((10, 6)).astype(np.float32),
        "ids": np.array([0, -1, 3, 9, -10], np.int64),
        "w": rng.standard_normal((5, 3)).astype(np.float32),
    }
    assert_matches_reference(g, one_kernel(g), inputs, atol=1e-5)


@pytest.mark.parametrize("gelu", ["erf", "tanh"])
def test_bias_gelu_residual_two_outputs(gelu, small_tiles):
    """The pre-activation h and gelu(h) + residual are both written."""

    def fn(b, x, w, bias, res):
        h = b.add(b.matmul(x, w), bias)
        if gelu == "erf":
            act = b.mul(b.mul(h, 0.5), b.add(b.erf(b.mul(h, 0.7071067811865476)), 1.0))
        else:
            inner = b.mul(b.add(h, b.mul(b.mul(b.mul(h, h), h), 0.044715)), 0.7978845608028654)
            act = b.mul(b.mul(h, 0.5), b.add(b.tanh(inner), 1.0))
        return h, b.add(act, res)

    g = graphs.build(fn, [(2, 18, 24), (24, 33), (33,), (18, 1)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), atol=1e-5)


def test_matmul_result_and_epilogue_both_written():
    """The raw product is an optional output the plan chose to write."""

    def fn(b, x, y):
        p = b.matmul(x, y)
        return p, b.sigmoid(b.mul(p, 2.0))

    g = graphs.build(fn, [(5, 3), (3, 4)])
    src = assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), atol=1e-5)
    assert src.count("tl.store(") == 2


def test_prologue_in_another_kernel():
    """A two-kernel plan: the transpose materialised by a pointwise kernel."""

    def fn(b, x, y):
        return b.tanh(b.matmul(b.transpose(x, (1, 0)), y))

    g = graphs.build(fn, [(4, 6), (4, 5)])
    t, mm, th = (n.name for n in g.nodes)
    plan = plan_from_sets(g, [[t], [mm, th]])
    assert_matches_reference(g, plan, graphs.random_inputs(g), atol=1e-5)


def test_fp16_operands():
    def fn(b, x, y, bias):
        return b.add(b.matmul(x, y), bias)

    g = graphs.build(fn, [(3, 17, 40), (40, 9), (9,)], dtype="float16")
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float64"])
def test_integer_and_fp64_matmuls(dtype, small_tiles):
    def fn(b, x, y):
        return b.add(b.matmul(x, y), x)

    g = graphs.build(fn, [(2, 19, 19), (19, 19)], dtype=dtype)
    rng = np.random.default_rng(0)
    inputs = {i.name: (rng.standard_normal(i.type.shape) * 5).astype(dtype) for i in g.inputs}
    assert_matches_reference(g, one_kernel(g), inputs, rtol=1e-12, atol=1e-12)


def test_gpu_tiles_are_dot_sized():
    """On a GPU every tl.dot tile is >= 16 in each dimension, even for tiny shapes."""
    g = graphs.build(lambda b, x, y: b.matmul(x, y), [(1, 3), (3, 2)])
    src = one_source(g)
    assert "BLOCK_M = 16" in src and "BLOCK_N = 16" in src and "BLOCK_K = 16" in src
    assert 'input_precision="ieee"' in src
    _matmul_kernel(g)


def test_large_tensors_use_64_bit_offsets():
    """Emission only: an operand of 2**31 elements switches offsets to int64."""
    g = graphs.build(lambda b, x, y: b.matmul(x, y), [(2, 2**15, 2**15), (2**15, 4)])
    src = one_source(g)
    assert "pid_b = tl.program_id(1).to(tl.int64)" in src and "dtype=tl.int64" in src


def test_a_batch_beyond_grid_axis_1_joins_grid_axis_0(monkeypatch):
    """Grid axis 1 holds 65,535 programs: a larger batch is counted on axis 0
    with the tiles, so even a lone matmul of 70,000 batch entries is a kernel."""
    from orchestrate.templates.matmul import emit as matmul_module

    g = graphs.build(lambda b, x, y: b.matmul(x, y), [(70000, 2, 2), (2, 2)])
    assert isinstance(spec_of(g, [n.name for n in g.nodes]), KernelSpec)
    src = one_source(g)
    assert "pid_b = pid // tiles" in src and "* 70000, 1)" in src
    # the same mapping, run: a batch of 5 beyond an axis of 2
    monkeypatch.setattr(matmul_module, "MAX_GRID_AXIS1", 2)
    g = graphs.build(lambda b, x, y: b.add(b.matmul(x, y), 1.0), [(5, 3, 4), (4, 3)])
    src = assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g), atol=1e-5)
    assert "pid_b = pid // tiles" in src


# -- split-K: SPLIT_K programs per tile, the last sums the partials in order ----------


@pytest.fixture
def split_k(monkeypatch, small_tiles):
    """Only the configurations with ``SPLIT_K`` = the number asked for."""
    offered = config.matmul

    def only(s):
        def space(*args):
            found = tuple(c for c in offered(*args) if dict(c.blocks).get("SPLIT_K") == s)
            assert found, f"no SPLIT_K {s} configuration for {args}"
            return found

        monkeypatch.setattr(config, "matmul", space)

    return only


def _run_twice(g: ir.Graph, planned) -> tuple[dict, dict, Program]:
    """Two runs of one program (its counters must be zero again after the first)."""
    program = Program(planned, g, load_kernels(emit(g, planned), interpret=True), interpret=True)
    inputs = graphs.random_inputs(g)
    return program.run(inputs), program.run(inputs), program


def _gelu_bias_residual(b, x, w, bias, res):
    h = b.add(b.matmul(x, w), bias)
    act = b.mul(b.mul(h, 0.5), b.add(b.erf(b.mul(h, 0.7071067811865476)), 1.0))
    return b.add(act, res)


@pytest.mark.parametrize(
    "fn, shapes, splits",
    [
        (lambda b, x, w: b.matmul(x, w), [(20, 300), (300, 24)], 2),
        (lambda b, x, w: b.matmul(x, w), [(20, 300), (300, 24)], 4),
        (_gelu_bias_residual, [(2, 20, 300), (300, 24), (24,), (20, 1)], 4),
        (lambda b, x, w, r: b.add(b.matmul(x, w), r), [(3, 17, 520), (520, 40), (3, 17, 40)], 8),
    ],
)
def test_split_k_sums_partials_once_and_resets_its_counters(fn, shapes, splits, split_k):
    """SPLIT_K programs per tile, K = 300 in 16-wide steps split 5 + 5 + 5 + 4
    (or 10 + 9): the float64 reference, the epilogue (bias, GELU, residual)
    applied once to the whole sum, the same bits on the second run, and every
    arrival counter back to zero."""
    split_k(splits)
    g = graphs.build(fn, shapes)
    planned = one_kernel(g)
    assert dict(planned.specs[0].config.blocks)["SPLIT_K"] == splits
    first, second, program = _run_twice(g, planned)
    want = reference.run(g, graphs.random_inputs(g), float64=True)
    for name in g.outputs:
        np.testing.assert_allclose(first[name], want[name], rtol=1e-5, atol=1e-5)
        assert first[name].tobytes() == second[name].tobytes(), name
    counters = program._scratch[SPLIT_K_COUNTERS]
    assert counters.numel() > 0 and not counters.any()
    src = emit(g, planned)
    assert src.count("tl.atomic_add(") == 1 and "if arrived == SPLIT_K - 1:" in src
    assert "tl.static_range(SPLIT_K)" in src  # slot order, not arrival order


def test_split_k_with_a_batch_beyond_grid_axis_1(monkeypatch, split_k):
    """The tile's counter counts the batch entry too when the batch shares grid axis 0."""
    from orchestrate.templates.matmul import emit as matmul_module

    monkeypatch.setattr(matmul_module, "MAX_GRID_AXIS1", 2)
    split_k(2)
    g = graphs.build(lambda b, x, y: b.add(b.matmul(x, y), 1.0), [(5, 18, 160), (160, 20)])
    planned = one_kernel(g)
    first, second, _ = _run_twice(g, planned)
    want = reference.run(g, graphs.random_inputs(g), float64=True)
    (out,) = g.outputs
    np.testing.assert_allclose(first[out], want[out], rtol=1e-5, atol=1e-5)
    assert first[out].tobytes() == second[out].tobytes()
    assert "pid_b = pid // tiles" in emit(g, planned)


def test_split_k_is_offered_only_to_underfilled_long_k_gemms():
    def splits(*args):
        return {dict(c.blocks).get("SPLIT_K", 1) for c in config.matmul(*args)}

    assert splits(128, 768, 3072, "float16", False, 1, 132) == {1, 2, 4, 8}
    assert splits(128, 768, 3072, "float16", False, 1, 0) == {1}  # no device: none
    assert splits(4096, 4096, 4096, "float16", False, 1, 132) == {1}  # tiles fill the GPU
    assert splits(128, 768, 64, "float16", False, 1, 132) == {1}  # K too short to share
    assert splits(128, 768, 3072, "float64", False, 1, 132) == {1}  # no tl.dot
