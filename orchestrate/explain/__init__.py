"""`orchestrate explain`: a plan as tables (its pictures: ``picture.py``
and ``roofline_chart.py``).

Everything here reads the plan only (``orchestrate.plan.Plan``, as read
from PLAN.json), so a plan can be explained on a machine that has neither
the model nor a GPU.
"""

from __future__ import annotations

from collections import Counter

from orchestrate.ir import FLOATS
from orchestrate.kernels.spec import LIBRARY
from orchestrate.plan import Plan, PlannedKernel, Tuning
from orchestrate.text import shown


def _us(x: float) -> str:
    return f"{x:,.2f}"


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _flops(n: int) -> str:
    for unit, scale in (("TF", 1e12), ("GF", 1e9), ("MF", 1e6), ("KF", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def _ops(result: Plan, k: PlannedKernel) -> str:
    op = {p.name: p.op for p in result.primitives}
    counts = Counter(op[p] for p in k.primitives)
    return " ".join(f"{o}x{c}" if c > 1 else o for o, c in sorted(counts.items()))


# block sizes that are the problem's, not the tiling's choice
_NOT_TILES = ("GROUP_M", "BLOCK_D", "BLOCK_DV", "SPLIT_K")


def _config(c) -> str:
    """A launch configuration in a few characters: the tile, then warps and
    stages (``64x64x32 w4 s3``; ``k4`` for four programs per tile splitting
    K; ``tf32`` when fp32 dots use TF32)."""
    tile = "x".join(str(v) for name, v in c.blocks if name not in _NOT_TILES)
    split = dict(c.blocks).get("SPLIT_K")
    tf32 = " tf32" if c.precision == "tf32" else ""
    return f"{tile} w{c.num_warps} s{c.num_stages}{f' k{split}' if split else ''}{tf32}"


def kernel_table(result: Plan, limit: int = 0) -> str:
    """One row per kernel: template, bytes, flops, time, bound, launch
    configuration, primitives."""
    rows = [k for k in result.kernels if not k.is_view]
    views = len(result.kernels) - len(rows)
    shown = rows if not limit else sorted(rows, key=lambda k: -k.predicted_us)[:limit]
    if limit and len(rows) > limit:
        shown = sorted(shown, key=lambda k: k.name)
    nw = max([18, *(len(k.name) + 1 for k in shown)])  # library templates' names are longer
    tw = max([12, *(len(k.template) + 1 for k in shown)])
    head = (
        f"{'kernel':<{nw}}{'template':<{tw}}{'bytes':>11}{'flops':>11}{'us':>10}  "
        f"{'bound':<8} {'config':<20} primitives"
    )
    lines = [head, "-" * len(head)]
    for k in shown:
        config = "torch call" if k.template in LIBRARY else _config(k.config)
        lines.append(
            f"{k.name:<{nw}}{k.template:<{tw}}{_bytes(k.bytes):>11}{_flops(k.flops):>11}"
            f"{_us(k.predicted_us):>10}  {k.bound:<8} {config:<20} {_ops(result, k)}"
        )
    if limit and len(rows) > limit:
        lines.append(
            f"... {len(rows) - limit} more kernels (the {limit} slowest shown; --limit 0 for all)"
        )
    if views:
        lines.append(f"+ {views} reshape views (no kernel)")
    return "\n".join(lines)


def summary_lines(result: Plan) -> list[str]:
    s, sol = result.summary, result.solver
    rows = [
        (name, result.baselines[name]) for name in ("unfused", "greedy") if name in result.baselines
    ]
    rows.append(("orchestrate", s))
    best = s.predicted_us
    functions = len({k.hash for k in result.kernels if not k.is_view})
    lines = [
        f"device {result.device}: {len(result.primitives)} primitives, "
        f"{sol.partitions} partitions ({sol.unique_partitions} unique), "
        f"{sol.candidates} candidate kernels ({sol.rejected} illegal sets rejected, "
        f"{sol.pruned} growths pruned"
        + (f", {sol.truncated_partitions} partitions truncated" if sol.truncated_partitions else "")
        + ")",
        f"solver: {sol.status}, gap {sol.gap:.4g}, {sol.seconds} s, {sol.solves} solves"
        + (
            f"; {sol.stitched} greedy merges across size cuts saved {sol.stitched_us:g} us"
            if sol.stitched
            else ""
        ),
        f"kernels: {s.kernels} planned, {functions} distinct specs",
        f"precision: {precision_text(result)}",
        *([] if result.options.rewrites else ["rewrite rules: off (--no-rewrites)"]),
        "",
        f"{'plan':<13}{'kernels':>8}{'bytes':>12}{'predicted us':>14}{'speedup':>9}",
    ]
    if result.tuning is not None:
        lines[2:2] = tuning_lines(result.tuning)
    for label, row in rows:
        speed = row.predicted_us / best if best else 1.0
        lines.append(
            f"{label:<13}{row.kernels:>8}{_bytes(row.bytes):>12}"
            f"{_us(row.predicted_us):>14}{speed:>8.2f}x"
        )
    return lines + rule_lines(result)


def rule_lines(result: Plan, shown: int = 3) -> list[str]:
    """The pattern rules that fired: their kernels, and the predicted time of
    the partitions they fired in, as planned and without the rule."""
    if not result.rules:
        return []
    lines = ["", "rules that fired (partitions where each fired: planned / without the rule):"]
    width = max(len(u.rule) for u in result.rules)
    for u in result.rules:
        gain = u.without_us / u.with_us if u.with_us else 1.0
        names = ", ".join(u.kernels[:shown]) + (", ..." if len(u.kernels) > shown else "")
        lines.append(
            f"  {u.rule:<{width}}  {len(u.kernels):>3} kernels  {_us(u.with_us)} / "
            f"{_us(u.without_us)} us ({gain:.2f}x)  {names}"
        )
    return lines


def tuning_lines(t: Tuning) -> list[str]:
    """What --tune measured, on what, and how the rest was scaled."""
    on = (
        f"FAKE timer ({t.gpu}): figures made up, not measurements"
        if t.fake
        else f"{t.gpu}, driver {t.driver}, triton {t.triton}"
    )
    lines = [
        f"tuning: {t.seconds} s, {t.specs} specs x up to {t.configs} configurations: "
        f"{t.measured} timed, {t.cached} from the cache, {t.failed} failed"
        + (f", {t.skipped} specs not timeable" if t.skipped else "")
        + f" ({on})"
    ]
    scales = ", ".join(f"{k} {v:.3g}" for k, v in t.scales.items())
    lines.append(
        "tuning: kernel times are measured where timed; the rest are the model's x "
        f"measured/predicted ({scales or 'nothing measured'}; else {t.overall:.3g})"
    )
    return lines


def precision_text(result: Plan) -> str:
    """What ``--dtype`` the plan was made at, and the dtypes its tensors hold."""
    held = Counter(p.dtype for p in result.primitives if p.dtype in FLOATS)
    tensors = ", ".join(f"{n} {d}" for d, n in sorted(held.items()))
    if result.options.dtype in (None, "fp32"):
        own = "the model's own" if result.options.dtype is None else "fp32"
        return f"{own} ({tensors or 'no float tensors'})"
    return f"{result.options.dtype}, fp32 accumulation, softmax and normalisation ({tensors})"


def rejected_table(result: Plan) -> str:
    lines = ["why neighbouring kernels were not fused:"]
    for r in result.rejected:
        lines.append(shown(f"  {r.producer} -> {r.consumer} via {r.tensor}: {r.reason}"))
    if not result.rejected:
        lines.append("  (no neighbouring kernels)")
    if result.declined:
        lines += ["", "rules that matched but declined:"]
        lines += [shown(f"  {d.rule} at {d.at}: {d.reason}") for d in result.declined]
    return "\n".join(lines)


def range_lines(family) -> list[str]:
    """A dynamic plan's dimensions, their ranges and where it was priced
    (``shapes/family.Family``)."""
    from orchestrate.shapes.family import ranged

    dims = ranged(family.dims)
    opt = family.named(family.at("opt"))
    codes = ", ".join(f"{d.code} = {d.shown}" for d in family.dims)
    return [
        f"range: {dims}; one kernels.py for every shape in it",
        f"planned and priced at OPT ({opt}); every kernel also legal at MIN and MAX",
        f"kernels printed with the dimensions as runtime arguments ({codes}); "
        f"{len(family.sliced)} constants sliced from MAX"
        + (f", {len(family.computed)} computed from the dimensions" if family.computed else ""),
    ]
