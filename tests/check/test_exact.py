"""The exact (modular fingerprint) check: its arithmetic, unmutated plans
passing, and mutants of real plans caught, every one."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from orchestrate import ir
from orchestrate.bundle import regenerate
from orchestrate.check.exact import check, kernels_of
from orchestrate.check.exact import field as F
from orchestrate.check.exact.fragment import analyse
from orchestrate.ir import Op
from orchestrate.kernels.spec import Siblings
from orchestrate.plan import pipeline
from orchestrate.templates.low_rank import LowRank
from tests import graphs

ROOT = Path(__file__).resolve().parents[2]
TINY_BERT = ROOT / "examples" / "models" / "tiny_bert.onnx"


# -- the field ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_root_has_order_q_and_exp_is_a_homomorphism(seed):
    f = F.draw(random.Random(seed))
    assert F.is_prime(f.p) and F.is_prime(f.q) and (f.p - 1) % f.q == 0 and f.p < 2**31
    # q prime, w != 1 and w^q == 1: the order of w is exactly q
    assert f.w != 1 and pow(f.w, f.q, f.p) == 1
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(0, f.q, 100, dtype=np.uint64) for _ in range(2))
    assert np.array_equal(F.mulmod(f.exp(a), f.exp(b), f.p), f.exp((a + b) % np.uint64(f.q)))
    assert [int(v) for v in f.exp(a[:5])] == [pow(f.w, int(x), f.p) for x in a[:5]]
    assert int(f.exp(np.array([f.q], np.uint64))[0]) == 1  # w^q = 1


def test_matmul_and_inverse_are_exact():
    f = F.draw(random.Random(7))
    rng = np.random.default_rng(0)
    a = rng.integers(0, f.p, (3, 40), dtype=np.uint64)
    b = rng.integers(0, f.p, (40, 5), dtype=np.uint64)
    want = (np.array(a, dtype=object) @ np.array(b, dtype=object)) % f.p
    assert np.array_equal(F.matmul(a, b, f.p).astype(object), want)
    inv = F.inverse(a, f.p)
    assert np.all(F.mulmod(a, inv, f.p)[a != 0] == 1)


def test_floats_map_as_dyadic_rationals():
    f = F.draw(random.Random(3))
    special = {"+inf": 1, "-inf": 2, "nan": 3}
    half, three, x = F.residues(np.array([0.5, 3.0, -1.25]), f.p, special)
    assert half * 2 % f.p == 1 and three == 3 and (x * 4 + 5) % f.p == 0
    assert list(F.residues(np.array([-np.inf, np.nan]), f.p, special)) == [2, 3]
    assert int(F.residues(np.float32(0.25), f.p, special)) * 4 % f.p == 1  # 0-d arrays


def test_fragment_names_what_it_leaves_out():
    g = graphs.build(lambda b, x: graphs.softmax(b, b.exp(x)), [(4, 8)])
    frag = analyse(g)
    why = {g.producer[n].op: r for n, r in frag.outside.items()}
    assert why == {
        Op.RMAX: "reduce_max",
        Op.EXP: "a second exp on a path",
        Op.DIV: "division by a computed value",
    }


# -- plans ---------------------------------------------------------------------------


def _attention(b, x):
    """Merged Q/K/V weights split by slices, scaled softmax attention with an
    additive mask, a residual add, a reduce sum: the structures rewrites touch."""
    rng = np.random.default_rng(0)
    w = b.constant(rng.standard_normal((8, 24)).astype("float32"))
    mask = b.constant(np.where(np.tri(6) > 0, 0.0, -1e4).astype("float32"))
    qkv = b.matmul(x, w)
    q, k, v = (b.slice_axis(qkv, 1, i * 8, (i + 1) * 8) for i in range(3))
    s = b.add(b.mul(b.matmul(q, b.transpose(k, [1, 0])), 0.25), mask)
    o = b.add(b.matmul(graphs.softmax(b, s), v), x)
    return o, b.sum(b.mul(o, 2.0), [0])


def _siblings(b, x):
    """Q/K/V-style projections of one activation, each with its bias (a
    narrower V, as with grouped-query heads), and a gate/up pair of another:
    what the merged-siblings rule merges."""
    rng = np.random.default_rng(1)

    def const(*shape):
        return b.constant(rng.standard_normal(shape).astype("float32"))

    q, k, v = (b.add(b.matmul(x, const(8, n)), const(n)) for n in (8, 8, 4))
    h = b.mul(x, 0.5)
    gate, up = b.matmul(h, const(8, 6)), b.matmul(h, const(8, 6))
    return q, k, v, b.mul(b.mul(gate, b.sigmoid(gate)), up)


def _lora(b, x):
    """Two LoRA-adapted projections as peft computes them: x @ W + bias +
    (x @ A) @ B * scaling; the first of rank 8 = K (so B can be applied to x
    itself), the second of rank 4: what the low-rank rule folds."""
    rng = np.random.default_rng(2)

    def const(*shape):
        return b.constant(rng.standard_normal(shape).astype("float32"))

    for k, n, r in ((8, 12, 8), (12, 8, 4)):
        x = b.add(
            b.add(b.matmul(x, const(k, n)), const(n)),
            b.mul(b.matmul(b.matmul(x, const(k, r)), const(r, n)), 0.5),
        )
    return x


def _small_graphs() -> dict[str, ir.Graph]:
    return {
        "attention": graphs.build(_attention, [(6, 8)]),
        "siblings": graphs.build(_siblings, [(2, 6, 8)]),
        "lora": graphs.build(_lora, [(2, 6, 8)]),
        "layernorm": graphs.build(graphs.layernorm, [(4, 16), (16,), (16,)]),
        "mlp": graphs.build(graphs.mlp, [(4, 8), (8, 16), (16,), (16, 8)]),
        "exp2": graphs.build(graphs.exp_into_two_reductions, [(8, 8)]),
    }


def _sides(original: ir.Graph):
    """(original, the plan's graph as regenerate rebuilds it, its kernels)."""
    planned = pipeline.plan_graph(original)
    plan = planned.plan
    consts = {k: original.constants[k] for k in plan.graph.constants}
    plan_graph = regenerate.primitive_graph(plan, consts, "test")
    return original, plan_graph, kernels_of(plan, plan_graph, planned.specs)


@pytest.fixture(scope="module")
def plans():
    out = {name: _sides(g) for name, g in _small_graphs().items()}
    out["tiny_bert"] = _sides(pipeline.fission_file(TINY_BERT))
    return out


def test_unmutated_plans_pass(plans):
    for name, (original, plan_graph, kernels) in plans.items():
        start = time.perf_counter()
        result = check(original, plan_graph, kernels)
        assert result.mismatch is None, (name, result.mismatch)
        assert result.ok and result.bound < 1e-9 and result.compared, name
        print(f"{name}: {result.lines()[0]} in {time.perf_counter() - start:.2f}s")


@pytest.mark.parametrize("model", ["gpt2", "llama", "t5"])
def test_unmutated_example_plans_pass(model, tmp_path):
    from examples import export_example

    path = tmp_path / f"{model}.onnx"
    export_example(model, str(path), dynamo=False, opset=17, size="tiny")
    result = check(*_sides(pipeline.fission_file(path)))
    assert result.ok, result.mismatch
    print(model, result.lines()[0])


# -- mutants -------------------------------------------------------------------------
# Each takes (plan graph, kernels) and returns a wrong plan, or None where it
# does not apply; applied to the plan side only.  A mutant that would leave
# the function unchanged (a transpose of equal dims, a scale of 1) is not made.


def _with(g: ir.Graph, node: ir.Node | None = None, constants=None) -> ir.Graph:
    nodes = tuple(node if node is not None and n.name == node.name else n for n in g.nodes)
    return ir.Graph(nodes, g.inputs, g.outputs, constants or g.constants, g.name)


def _const_value(g, name):
    c = g.constants.get(name)
    return None if c is None or c.dtype.kind != "f" else c


def _swap_op(g, ks, n):
    swap = {Op.ADD: Op.SUB, Op.SUB: Op.ADD, Op.MUL: Op.DIV, Op.DIV: Op.MUL}
    if n.op not in swap:
        return None
    c = _const_value(g, n.inputs[1])
    if n.op in (Op.MUL, Op.DIV) and c is not None and np.all(np.abs(c) == 1):
        return None  # x * 1 == x / 1
    if n.op in (Op.ADD, Op.SUB) and c is not None and np.all(c == 0):
        return None
    return _with(g, replace(n, op=swap[n.op])), ks


def _swap_operands(g, ks, n):
    if n.op not in (Op.SUB, Op.MATMUL, Op.DIV) or n.inputs[0] == n.inputs[1]:
        return None
    a, b = (g.types[i].shape for i in n.inputs)
    if n.op is Op.MATMUL and a != b:
        return None
    return _with(g, replace(n, inputs=n.inputs[::-1])), ks


def _drop_scale(g, ks, n):
    """x * c or x / c (a scale) becomes x; x + y (a residual) becomes x."""
    if n.op not in (Op.MUL, Op.DIV, Op.ADD):
        return None
    x, c = n.inputs
    const = _const_value(g, c)
    if n.op is not Op.ADD and (const is None or np.all(np.abs(const) == 1)):
        return None
    if n.op is Op.ADD and (const is not None or g.types[x] != n.type):
        return None
    if g.types[x] != n.type:
        return None
    return _with(g, replace(n, op=Op.IDENTITY, inputs=(x,), attrs=ir.Attrs())), ks


def _transpose_perm(g, ks, n):
    if n.op is not Op.TRANSPOSE:
        return None
    perm = tuple(n.attrs["perm"])
    src = g.types[n.inputs[0]].shape
    probe = np.arange(int(np.prod(src))).reshape(src)
    for i in range(len(perm)):
        for j in range(i + 1, len(perm)):
            p = list(perm)
            p[i], p[j] = p[j], p[i]
            if tuple(src[k] for k in p) == n.shape and not np.array_equal(
                probe.transpose(p), probe.transpose(perm)
            ):
                return _with(g, replace(n, attrs=ir.Attrs(n.attrs, perm=tuple(p)))), ks
    return None


def _slice_offset(g, ks, n):
    if n.op is not Op.SLICE:
        return None
    src = g.types[n.inputs[0]].shape
    starts = list(n.attrs["starts"])
    for ax, (s, step, count) in enumerate(zip(starts, n.attrs["steps"], n.attrs["shape"])):
        for shift in (1, -1):
            t = s + shift
            if step == 1 and 0 <= t and t + count <= src[ax] and count < src[ax]:
                starts[ax] = t
                return _with(g, replace(n, attrs=ir.Attrs(n.attrs, starts=tuple(starts)))), ks
    return None


def _reduce_axis(g, ks, n):
    if n.op is not Op.SUM:
        return None
    src = g.types[n.inputs[0]].shape
    (axis,) = n.attrs["axes"] if len(n.attrs["axes"]) == 1 else (None,)
    if axis is None:
        return None
    for other in range(len(src)):
        if other != axis % len(src) and src[other] == src[axis] and src[other] > 1:
            return _with(g, replace(n, attrs=ir.Attrs(n.attrs, axes=(other,)))), ks
    return None


def _wrong_constant(g, ks, n):
    for c in n.inputs:
        arr = _const_value(g, c)
        if arr is not None and np.all(np.isfinite(arr)):
            with np.errstate(over="ignore"):
                wrong = (arr * 3 + 1).astype(arr.dtype)  # a wrong scale, mask, weight
            if np.all(np.isfinite(wrong)):
                return _with(g, constants={**g.constants, c: wrong}), ks
    return None


def _drop_exp(g, ks, n):
    if n.op not in (Op.EXP, Op.NEG):
        return None
    return _with(g, replace(n, op=Op.IDENTITY, attrs=ir.Attrs())), ks


def _other_tensor(g, ks, n):
    """The kernel running ``n`` reads another tensor of the same type, written
    before it (what a mis-wired kernel does)."""
    i = next(i for i, k in enumerate(ks) if n.name in k.nodes)
    k = ks[i]
    ready = [x.name for x in g.inputs] + [t for kk in ks[:i] for t in kk.outputs]
    for pos, t in enumerate(n.inputs):
        if t not in k.inputs or t in g.constants:
            continue
        other = next((r for r in ready if r != t and g.types[r] == g.types[t]), None)
        if other is None:
            continue
        inputs = n.inputs[:pos] + (other,) + n.inputs[pos + 1 :]
        k2 = replace(k, inputs=tuple(dict.fromkeys(k.inputs + (other,))))
        return _with(g, replace(n, inputs=inputs)), ks[:i] + (k2,) + ks[i + 1 :]
    return None


def _drop_kernel(g, ks, n):
    i = next(i for i, k in enumerate(ks) if n.name in k.nodes)
    return g, ks[:i] + ks[i + 1 :]


# Wrong splits of merged weights: a merged matmul's roles (its segments)
# changed, the plan's graph left alone; each applies where ``n`` anchors a
# segment of a merged matmul.


def _segment(ks, n):
    """(kernel index, kernel, segments as a list, segment index) of the merged
    matmul whose segment ``n`` anchors, or None."""
    for i, k in enumerate(ks):
        for j, s in enumerate(k.roles.segments if isinstance(k.roles, Siblings) else ()):
            if s.anchor == n.name:
                return i, k, list(k.roles.segments), j
    return None


def _resegmented(ks, i, k, segments, **fields):
    merged = replace(k.roles, segments=tuple(segments))
    return ks[:i] + (replace(k, roles=merged, **fields),) + ks[i + 1 :]


def _swap_ranges(g, ks, n):
    """Segment n and the next take each other's columns."""
    found = _segment(ks, n)
    if found is None or found[3] + 1 == len(found[2]):
        return None
    i, k, segs, j = found
    a, b = segs[j], segs[j + 1]
    segs[j], segs[j + 1] = (
        replace(a, start=b.start, stop=b.stop),
        replace(b, start=a.start, stop=a.stop),
    )
    return g, _resegmented(ks, i, k, segs)


def _shift_range(g, ks, n):
    """Segment n's columns one to the right (one to the left for the last)."""
    found = _segment(ks, n)
    if found is None:
        return None
    i, k, segs, j = found
    step = 1 if j + 1 < len(segs) else -1
    segs[j] = replace(segs[j], start=segs[j].start + step, stop=segs[j].stop + step)
    return g, _resegmented(ks, i, k, segs)


def _reorder_segments(g, ks, n):
    """Segment n and the next exchange places in the concatenation, each
    keeping its recorded columns."""
    found = _segment(ks, n)
    if found is None or found[3] + 1 == len(found[2]):
        return None
    i, k, segs, j = found
    segs[j], segs[j + 1] = segs[j + 1], segs[j]
    return g, _resegmented(ks, i, k, segs)


def _drop_sibling(g, ks, n):
    """Segment n dropped from the merged matmul, with what it computes and writes."""
    found = _segment(ks, n)
    if found is None:
        return None
    i, k, segs, j = found
    gone = {segs[j].anchor, *segs[j].epilogue}
    del segs[j]
    return g, _resegmented(
        ks,
        i,
        k,
        segs,
        nodes=tuple(x for x in k.nodes if x not in gone),
        outputs=tuple(x for x in k.outputs if x not in gone),
    )


def _wrong_bias_segment(g, ks, n):
    """Segment n's epilogue (its bias add) run in the next segment."""
    found = _segment(ks, n)
    if found is None or not found[2][found[3]].epilogue:
        return None
    i, k, segs, j = found
    other = (j + 1) % len(segs)
    segs[other] = replace(segs[other], epilogue=segs[other].epilogue + segs[j].epilogue)
    segs[j] = replace(segs[j], epilogue=())
    return g, _resegmented(ks, i, k, segs)


# Wrong low-rank rewrites: a low-rank kernel's roles changed, the plan's
# graph left alone; each applies where ``n`` anchors a low-rank kernel.


def _low_rank(ks, n, dropped=(), **fields):
    """The kernels with the low-rank roles of the kernel ``n`` anchors
    changed, and the nodes ``dropped`` no longer run."""
    for i, k in enumerate(ks):
        if isinstance(k.roles, LowRank) and k.roles.anchor == n.name:
            k2 = replace(
                k,
                roles=replace(k.roles, **fields),
                nodes=tuple(t for t in k.nodes if t not in dropped),
            )
            return ks[:i] + (k2,) + ks[i + 1 :]
    return None


def _roles(ks, n):
    return next(
        (k.roles for k in ks if isinstance(k.roles, LowRank) and k.roles.anchor == n.name), None
    )


def _b_without_a(g, ks, n):
    """B applied to x itself (x @ A skipped), where x has rank-many columns."""
    roles = _roles(ks, n)
    if roles is None or g.types[roles.x].shape[-1] != roles.rank:
        return None
    return g, _low_rank(ks, n, dropped=(roles.down,), down="")


def _wrong_rank_slice(g, ks, n):
    """The concatenation one column short: A's last column and B's last row left out."""
    roles = _roles(ks, n)
    return None if roles is None else (g, _low_rank(ks, n, rank=roles.rank - 1))


def _drop_low_rank(g, ks, n):
    """The low-rank term dropped: no columns concatenated."""
    return None if _roles(ks, n) is None else (g, _low_rank(ks, n, rank=0))


def _drop_alpha(g, ks, n):
    """The branch's scale (alpha / r) left out."""
    roles = _roles(ks, n)
    if roles is None or not roles.scaling:
        return None
    return g, _low_rank(ks, n, dropped=roles.scaling, scaling=())


MUTATIONS = [
    _swap_op,
    _swap_operands,
    _drop_scale,
    _transpose_perm,
    _slice_offset,
    _reduce_axis,
    _wrong_constant,
    _drop_exp,
    _other_tensor,
    _drop_kernel,
    _swap_ranges,
    _shift_range,
    _reorder_segments,
    _drop_sibling,
    _wrong_bias_segment,
    _b_without_a,
    _wrong_rank_slice,
    _drop_low_rank,
    _drop_alpha,
]


def mutants(name, plan_graph, kernels, per_kind: int):
    """Up to ``per_kind`` mutants of each kind, spread over the graph."""
    for mutate in MUTATIONS:
        made = [
            (n.name, m)
            for n in plan_graph.nodes
            if (m := mutate(plan_graph, kernels, n)) is not None
        ]
        stride = max(1, len(made) // per_kind)
        for node, m in made[::stride][:per_kind]:
            yield f"{name}:{mutate.__name__[1:]}@{node}", m


def test_every_mutant_is_caught(plans):
    start, caught, escaped, kinds = time.perf_counter(), 0, [], set()
    for name, (original, plan_graph, kernels) in plans.items():
        per_kind = 4 if name == "tiny_bert" else 2
        for label, (g, ks) in mutants(name, plan_graph, kernels, per_kind):
            result = check(original, g, ks)
            kinds.add(label.split(":")[1].split("@")[0])
            if result.mismatch is None:
                escaped.append(label)
            else:
                caught += 1
    total = caught + len(escaped)
    print(
        f"{caught}/{total} mutants caught in {time.perf_counter() - start:.1f}s "
        f"({len(kinds)} kinds)"
    )
    assert not escaped, escaped
    assert total >= 50 and len(kinds) == len(MUTATIONS), (total, kinds)


def test_cli_verify_exact(tmp_path):
    from click.testing import CliRunner

    from orchestrate import api, cli

    out = tmp_path / "bert.orch"
    api.optimize(TINY_BERT, out, trials=0)
    r = CliRunner().invoke(cli.main, ["verify", str(out), "--model", str(TINY_BERT), "--exact"])
    assert r.exit_code == 0, r.output
    assert "false-pass bound" in r.output and "/layers.0/Softmax: reduce_max" in r.output
    bound = float(r.output.rsplit("false-pass bound ", 1)[1].rstrip(")\n"))
    assert 0 < bound < 1e-9
    r = CliRunner().invoke(
        cli.main, ["verify", str(out), "--model", str(tmp_path / "no.onnx"), "--exact"]
    )
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
