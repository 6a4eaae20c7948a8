"""The row-reduce generator against the reference executor, in the interpreter.

Both forms are tested: the single-pass form (whole rows in registers) and the
looped form (one loop over column blocks per dependent phase), the latter on
small shapes by lowering the single-pass limit and the loop block.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrate.ir import Op
from orchestrate.kernels.spec import Rejection
from orchestrate.templates.row_reduce import config
from tests import graphs
from tests.emit_util import assert_matches_reference, one_kernel, plan_from_sets, spec_of
from tests.util import has_nvidia_backend

# masked-out lanes of partial blocks compute on neutral values (inf - inf)
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


@pytest.fixture
def looped(monkeypatch):
    """Rows longer than 4 are looped over, 4 (GPU) / 8 (interpreter) columns at a time."""
    monkeypatch.setattr(config, "SINGLE_PASS_ROW", 4)
    monkeypatch.setattr(config, "LOOP_BLOCK", 4)
    monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 8)


def check(fn, shapes, dtype="float32", seed=0, rtol=1e-5, atol=1e-6, inputs=None):
    g = graphs.build(fn, shapes, dtype=dtype)
    inputs = inputs if inputs is not None else graphs.random_inputs(g, seed)
    return assert_matches_reference(g, one_kernel(g), inputs, rtol=rtol, atol=atol)


def log_softmax(b, x, axis=-1):
    m = b.reduce_max(x, [axis])
    d = b.sub(x, m)
    return b.sub(d, b.log(b.sum(b.exp(d), [axis])))


def rmsnorm(b, x, gamma):
    ms = b.mean(b.mul(x, x), [-1])
    return b.mul(b.mul(x, b.recip(b.sqrt(b.add(ms, 1e-6)))), gamma)


def arg(b, x, op, axis, keepdims=True, last=False):
    return b.emit(op, [x], axis=axis, keepdims=keepdims, select_last_index=last)


# -- softmax family ------------------------------------------------------------


SOFTMAX_CASES = [
    ((4, 7), -1),
    ((1, 13), -1),
    ((2, 5, 3), 1),  # middle axis: rows are not contiguous
    ((5, 3, 2), 0),  # first axis
    ((2, 3, 4, 5), 1),  # softmax over the channels of NCHW
    ((37, 11), -1),  # several programs, partial last block
]


@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES)
def test_softmax(shape, axis):
    check(lambda b, x: graphs.softmax(b, x, axis), [shape])


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (1, 3, 1)])
def test_rows_of_one_element(shape):
    """Row length 1.  (Softmax itself cannot be one kernel there: with rows
    as long as one element, classify takes x - max for a row value.)"""

    def fn(b, x):
        return b.sum(b.exp(x), [-1]), b.reduce_max(x, [-1], keepdims=False), b.neg(x)

    check(fn, [shape])


@pytest.mark.parametrize("shape,axis", [((3, 13), -1), ((2, 11, 3), 1), ((9, 2), 0)])
def test_softmax_looped(looped, shape, axis):
    src = check(lambda b, x: graphs.softmax(b, x, axis), [shape])
    assert src.count("for c0 in range") == 3  # max, sum, epilogue


def test_log_softmax_single_and_looped(monkeypatch):
    check(log_softmax, [(6, 9)])
    check(lambda b, x: log_softmax(b, x, 0), [(9, 3)])
    monkeypatch.setattr(config, "SINGLE_PASS_ROW", 4)
    monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 4)
    check(log_softmax, [(6, 9)])


def test_long_rows():
    """4096-long rows: single pass under the limit, looped over it."""
    check(graphs.softmax, [(3, 4096)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config, "SINGLE_PASS_ROW", 1024)
        mp.setattr(config, "INTERPRET_LOOP_BLOCK", 1024)
        src = check(graphs.softmax, [(3, 4096)])
    assert "for c0 in range(0, 4096, BLOCK_COLS)" in src


def test_several_reduced_axes():
    """Two reduced axes, not contiguous: column index split over both."""
    check(lambda b, x: _softmax_axes(b, x, [0, 2]), [(3, 4, 5)])
    check(lambda b, x: _softmax_axes(b, x, [1, 3]), [(2, 3, 2, 5)])


def test_several_reduced_axes_looped(looped):
    check(lambda b, x: _softmax_axes(b, x, [1, 3]), [(2, 3, 2, 5)])


def _softmax_axes(b, x, axes):
    m = b.reduce_max(x, axes)
    e = b.exp(b.sub(x, m))
    return b.div(e, b.sum(e, axes))


def test_all_axes_reduced():
    """One row: a scalar (rank-0) row output and a softmax over everything."""

    def fn(b, x):
        return b.sum(x, [0, 1], keepdims=False), _softmax_axes(b, x, [0, 1])

    check(fn, [(3, 5)])


@settings(max_examples=10, deadline=None)
@given(
    shape=st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=1, max_size=4),
    mask=st.integers(1, 15),
    loop=st.booleans(),
    seed=st.integers(0, 99),
)
def test_random_axes(shape, mask, loop, seed):
    axes = [a for a in range(len(shape)) if mask >> a & 1]
    assume(axes and np.prod([shape[a] for a in axes]) > 1)

    def fn(b, x):
        mu = b.mean(x, axes)
        d = b.sub(x, mu)
        return _softmax_axes(b, d, axes), b.reduce_max(d, axes, keepdims=False)

    with pytest.MonkeyPatch.context() as mp:
        if loop:
            mp.setattr(config, "SINGLE_PASS_ROW", 1)
            mp.setattr(config, "INTERPRET_LOOP_BLOCK", 2)
        check(fn, [tuple(shape)], seed=seed)


# -- normalisations ------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 10), (2, 3, 7), (1, 6)])
def test_layernorm(shape):
    check(graphs.layernorm, [shape, shape[-1:], shape[-1:]])


def test_layernorm_looped(looped):
    src = check(graphs.layernorm, [(3, 11), (11,), (11,)], rtol=1e-5, atol=1e-5)
    assert src.count("for c0 in range") == 3  # mean, variance, epilogue


def test_rmsnorm_single_and_looped(monkeypatch):
    check(rmsnorm, [(5, 16), (16,)])
    monkeypatch.setattr(config, "SINGLE_PASS_ROW", 8)
    monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 8)
    src = check(rmsnorm, [(5, 19), (19,)])
    assert src.count("for c0 in range") == 2


def test_epilogue_broadcasting_in_every_position():
    """Epilogue inputs: per column, per row (keepdims), one element, full."""

    def fn(b, x, col, row, one, full):
        s = graphs.softmax(b, x, 1)
        return b.add(b.mul(b.sub(s, row), col), b.mul(one, full))

    check(fn, [(3, 6, 4), (6, 1), (3, 1, 4), (1,), (3, 6, 4)])


def test_row_inputs_of_row_values():
    """A row-space node reading an external per-row tensor, squeezed output."""

    def fn(b, x, scale):
        s = b.sum(x, [1], keepdims=False)  # (4, 3)
        return b.mul(s, scale)

    check(fn, [(4, 5, 3), (4, 3)])


def test_transposed_prologue():
    """The reduction reads a transpose of its input: strided loads."""

    def fn(b, x):
        return graphs.softmax(b, b.transpose(x, (1, 0)), -1)

    check(fn, [(7, 5)])


@pytest.mark.parametrize("loop", [False, True])
def test_layout_in_the_prologue(monkeypatch, loop):
    """concat, reversed slice and pad of inputs become index arithmetic on the loads."""
    if loop:
        monkeypatch.setattr(config, "SINGLE_PASS_ROW", 4)
        monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 4)

    def fn(b, x, y, z):
        c = b.concat([x, y], 1)  # (4, 11)
        r = b.slice(c, (0, 10), (1, -1), (4, 11))  # columns reversed
        p = b.pad(z, (0, 1, 0, 1), "reflect")  # (4, 9) -> (4, 11)
        return graphs.softmax(b, b.add(r, p))

    check(fn, [(4, 8), (4, 3), (4, 9)])


def test_embedding_layernorm():
    """gather feeding a layernorm: rows of the table picked by index."""
    from orchestrate import ir
    from orchestrate.decompose.builder import Builder, Value
    from orchestrate.ir import type_rules

    b = Builder()
    b.begin("g", "g")
    table = Value("table", ir.TensorType((10, 12), "float32"))
    ids = Value("ids", ir.TensorType((2, 3), "int64"))
    gamma = Value("gamma", ir.TensorType((12,), "float32"))
    out = graphs.layernorm(b, b.gather(table, ids, 0), gamma, 0.5)
    inputs = (
        ir.Input("table", table.type),
        ir.Input("ids", ids.type),
        ir.Input("gamma", gamma.type),
    )
    g = type_rules.validate(ir.Graph(tuple(b.nodes), inputs, (out.name,), b.constants))
    rng = np.random.default_rng(0)
    feeds = {
        "table": rng.standard_normal((10, 12)).astype(np.float32),
        "ids": np.array([[0, -1, 3], [9, -10, 2]], np.int64),
        "gamma": rng.standard_normal(12).astype(np.float32),
    }
    assert_matches_reference(g, one_kernel(g), feeds)


def test_row_values_of_higher_rank():
    """A row-space node with more (size-1) dimensions than the reductions it reads."""

    def fn(b, x, one):
        s = b.add(b.sum(x, [2], keepdims=False), one)  # (2, 3) + (1, 1, 1) -> (1, 2, 3)
        return s, b.mul(x, b.reshape(s, (2, 3, 1)))

    check(fn, [(2, 3, 4), (1, 1, 1)])


def test_reshaped_row_values():
    """Row values reshaped (squeezed, flattened, back to keepdims) stay per row."""

    def fn(b, x, w):
        r = b.mul(b.reshape(b.sum(x, [2], keepdims=False), (6,)), w)
        return r, b.sub(x, b.reshape(r, (2, 3, 1)))

    check(fn, [(2, 3, 4), (6,)])


# -- other reductions ----------------------------------------------------------


@pytest.mark.parametrize("keepdims", [True, False])
def test_min_prod_and_both_outputs(keepdims):
    """A row output (squeezed or not) and a full-space output from one kernel."""

    def fn(b, x):
        mn = b.reduce_min(x, [1], keepdims=keepdims)
        p = b.prod(b.add(b.mul(x, 0.1), 1.0), [1], keepdims=keepdims)
        mk = b.reduce_min(x, [1]) if not keepdims else mn
        return mn, p, b.sub(x, mk)

    check(fn, [(4, 9)])


def test_min_prod_looped(looped):
    def fn(b, x):
        p = b.prod(b.add(b.mul(x, 0.1), 1.0), [0], keepdims=False)
        return b.reduce_min(x, [0], keepdims=False), p

    check(fn, [(11, 3)])


@pytest.mark.parametrize("op", [Op.ARGMAX, Op.ARGMIN])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("loop", [False, True])
def test_arg_reductions_with_ties(monkeypatch, op, last, loop):
    if loop:
        monkeypatch.setattr(config, "SINGLE_PASS_ROW", 2)
        monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 4)
    x = np.array(
        [
            [1, 3, 3, 0, 2, -1, 3, 0, -1, 2],  # ties of the max over blocks
            [-1, -1, 5, -1, 5, -1, 0, 0, 0, -1],
            [
                -np.inf,
                -np.inf,
                -np.inf,
                -np.inf,
                -np.inf,
                -np.inf,
                -np.inf,
                -np.inf,
                -np.inf,
                -np.inf,
            ],
            [np.inf, np.inf, np.inf, np.inf, np.inf, np.inf, np.inf, np.inf, np.inf, np.inf],
            [0, np.nan, 1, np.nan, 2, 7, 7, 0, 0, 9],  # NaN wins
        ],
        np.float32,
    )

    def fn(b, x):
        return arg(b, x, op, 1, keepdims=False, last=last), arg(b, x, op, 1, last=last)

    check(fn, [x.shape], inputs={"x0": x})


@pytest.mark.parametrize("loop", [False, True])
def test_argmax_first_axis_int32(monkeypatch, loop):
    if loop:
        monkeypatch.setattr(config, "SINGLE_PASS_ROW", 2)
        monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 2)
    x = np.array([[3, 1, 2], [3, 5, 2], [0, 5, 9], [3, 5, 9], [-7, 0, 9]], np.int32)

    def fn(b, x):
        return (
            arg(b, x, Op.ARGMAX, 0),
            arg(b, x, Op.ARGMIN, 0, last=True),
            b.reduce_max(x, [0]),
            b.sum(x, [0], keepdims=False),
        )

    check(fn, [x.shape], dtype="int32", inputs={"x0": x})


@pytest.mark.parametrize("loop", [False, True])
def test_nan_and_inf_propagate(monkeypatch, loop):
    if loop:
        monkeypatch.setattr(config, "SINGLE_PASS_ROW", 2)
        monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 2)
    x = np.array(
        [[1, np.nan, 3, 0, 2], [np.inf, 1, 2, 3, 4], [-np.inf, 1, 2, 3, 4], [1, 2, 3, 4, np.nan]],
        np.float32,
    )

    def fn(b, x):
        return (
            b.reduce_max(x, [1]),
            b.reduce_min(x, [1]),
            b.sum(x, [1]),
            b.prod(x, [1]),
            graphs.softmax(b, x),
        )

    check(fn, [x.shape], inputs={"x0": x})


# -- split rows: several programs per row, the last combining ---------------------


@pytest.fixture
def split(monkeypatch):
    """Rows longer than 4 are looped over, 4 (GPU) / 8 (interpreter) columns
    at a time, and a splittable row is split over 3 programs."""
    monkeypatch.setattr(config, "SINGLE_PASS_ROW", 4)
    monkeypatch.setattr(config, "LOOP_BLOCK", 4)
    monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 8)
    own = config.row_reduce

    def three(*args, **kw):
        configs = own(*args, **kw)
        pick = [
            c.__class__(
                blocks=tuple((k, 3 if k == "SPLIT_K" else v) for k, v in c.blocks),
                num_warps=c.num_warps,
                num_stages=c.num_stages,
                interpret=tuple((k, 3 if k == "SPLIT_K" else v) for k, v in c.interpret),
            )
            for c in configs
            if "SPLIT_K" in dict(c.blocks)
        ]
        return pick[:1] or configs

    monkeypatch.setattr(config, "row_reduce", three)


@pytest.mark.parametrize("shape,axes", [((3, 37), [1]), ((2, 5, 7), [0, 2]), ((1, 50), [1])])
def test_a_split_row_reduce_matches_the_reference(split, shape, axes):
    """Sum, max, min and product in one phase, a row epilogue (the mean,
    the norm) and a full-space output stored before the reduction, each
    row's columns shared by three programs; the last one combines."""

    def fn(b, x):
        sq = b.mul(x, x)
        return (
            b.mean(x, axes),
            b.sqrt(b.sum(sq, axes)),
            b.reduce_max(x, axes),
            b.reduce_min(x, axes, keepdims=False),
            b.prod(b.add(b.mul(x, 0.01), 1.0), axes),
            sq,
        )

    g = graphs.build(fn, [shape])
    src = assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g, 0), rtol=2e-5)
    assert "SPLIT_K = 3" in src and "tl.atomic_add(counter" in src


def test_a_split_row_propagates_nan_from_any_share(split):
    """A NaN in one program's share wins the max and the sum, whichever
    program combines (numpy's max propagates it)."""
    x = np.arange(40, dtype=np.float32).reshape(2, 20)
    x[0, 17] = np.nan  # in the last share
    x[1, 2] = np.nan  # in the first

    def fn(b, x):
        return b.reduce_max(x, [1]), b.reduce_min(x, [1]), b.sum(x, [1])

    check(fn, [x.shape], inputs={"x0": x})


def test_what_reads_a_row_result_over_the_row_is_not_split(split):
    """A softmax needs its max over the whole row before its exponentials:
    no share of the row can compute them, so its row is looped, not split."""
    g = graphs.build(graphs.softmax, [(2, 30)])
    spec = one_kernel(g).specs[0]
    assert spec.roles.looped and "SPLIT_K" not in dict(spec.config.blocks)


# -- dtypes, plans, errors -----------------------------------------------------


@pytest.mark.parametrize("loop", [False, True])
def test_float16(monkeypatch, loop):
    if loop:
        monkeypatch.setattr(config, "SINGLE_PASS_ROW", 8)
        monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 8)

    def fn(b, x, g, bt):
        return graphs.layernorm(b, x, g, bt), graphs.softmax(b, x)

    check(fn, [(4, 24), (24,), (24,)], dtype="float16", rtol=2e-3, atol=2e-3)


def test_kernels_of_a_split_plan():
    """A softmax split over two kernels: the max in one, the rest in another
    (the max is read as an external per-row tensor)."""
    g = graphs.build(graphs.softmax, [(5, 6)])
    names = [n.name for n in g.nodes]
    plan = plan_from_sets(g, [names[:1], names[1:]])
    assert_matches_reference(g, plan, graphs.random_inputs(g))


def test_row_values_moved_across_rows_are_refused_by_the_rule():
    """A transpose of a row-dependent value would read other rows' results:
    the rule refuses the set, so no plan can hold it."""
    g = graphs.build(lambda b, x: b.transpose(graphs.softmax(b, x), (1, 0)), [(4, 4)])
    r = spec_of(g, [n.name for n in g.nodes])
    assert isinstance(r, Rejection) and "across rows" in r.reason, r


# -- compiled Triton -----------------------------------------------------------

# The interpreter does not type-check what the compiler does (loop-carried
# types, reduce combine functions, pointer/mask shapes), so the generated
# kernels are also compiled for sm_90, on the CPU, in a process without
# TRITON_INTERPRET (Triton decides interpreter or compiler at import).
_COMPILE = textwrap.dedent(
    """
    import importlib.util, tempfile
    from orchestrate.emit import emit
    from orchestrate.check.compile_check import compile_module
    from orchestrate.ir import Op
    from orchestrate.templates.row_reduce import config
    from tests import graphs
    from tests.emit_util import one_kernel

    def every_reduction(b, x):
        args = dict(keepdims=True, select_last_index=True)
        return (b.reduce_max(x, [1]), b.reduce_min(x, [1], keepdims=False),
                b.emit(Op.ARGMAX, [x], axis=1, **args), b.emit(Op.ARGMIN, [x], axis=1, **args))

    def with_sum(b, x):
        return every_reduction(b, x) + (b.sum(x, [1]), b.prod(x, [1]))

    cases = [(graphs.softmax, [(37, 11)], "float32"), (graphs.softmax, [(37, 11)], "float16"),
             (graphs.layernorm, [(4, 100), (100,), (100,)], "float32"),
             (lambda b, x: graphs.softmax(b, x, 1), [(2, 3, 4, 5)], "float32"),
             (with_sum, [(5, 40)], "float32"), (with_sum, [(5, 40)], "int32"),
             (every_reduction, [(5, 40)], "uint8")]
    for limit in (16384, 8):
        config.SINGLE_PASS_ROW = limit
        for fn, shapes, dtype in cases:
            g = graphs.build(fn, shapes, dtype=dtype)
            path = tempfile.mktemp(suffix=".py")
            open(path, "w").write(emit(g, one_kernel(g)))
            spec = importlib.util.spec_from_file_location(f"k{abs(hash(path))}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            compile_module(mod, {t: ty.dtype for t, ty in g.types.items()})
    print("compiled")
    """
)


def test_kernels_compile_for_sm90():
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("no ptxas to compile with")
    assert run.returncode == 0, run.stderr[-4000:]
