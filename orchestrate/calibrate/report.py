"""Calibrate's tables and its scatter plot."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrate.calibrate.harness import runtime_class
from orchestrate.calibrate.predict import Prediction, Skipped
from orchestrate.calibrate.stats import Fit, fit
from orchestrate.text import shown


@dataclass(frozen=True)
class Table:
    """Rows of (group, Fit) under a heading."""

    heading: str
    rows: tuple[tuple[str, Fit], ...]


def table(heading: str, found: Sequence[Prediction], key: Callable[[Prediction], str]) -> Table:
    """One Fit per group ``key`` gives, in sorted order, and one for all."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for p in found:
        groups.setdefault(key(p), []).append((p.predicted_us, p.measurement.time_us))
    rows = [(g, fit(pairs)) for g, pairs in sorted(groups.items())]
    every = [(p.predicted_us, p.measurement.time_us) for p in found]
    return Table(heading, (*rows, ("all", fit(every))))


def tables(found: Sequence[Prediction]) -> list[Table]:
    """Per GPU and runtime; per GPU, runtime and kind."""
    return [
        table("by GPU and runtime", found, lambda p: _gpu_runtime(p)),
        table(
            "by GPU, runtime and kind",
            found,
            lambda p: f"{_gpu_runtime(p)} {p.measurement.kind}",
        ),
    ]


def _gpu_runtime(p: Prediction) -> str:
    return f"{p.measurement.gpu} {runtime_class(p.measurement.runtime)}"


def text(found: Sequence[Prediction], skipped: Sequence[Skipped]) -> str:
    """The tables as calibrate prints them, and the rows it could not price."""
    lines = [
        f"{len(found)} measurements predicted, {len(skipped)} skipped; every "
        "predicted time is the cost model's, every measured one published",
        "",
    ]
    for t in tables(found):
        lines += [*table_lines(t), ""]
    if skipped:
        reasons = Counter(s.reason.split(": ")[-1][:100] for s in skipped)
        lines.append("skipped (count: reason):")
        lines += [f"  {n:4d}: {shown(r)}" for r, n in reasons.most_common()]
    return "\n".join(lines).rstrip() + "\n"


def table_lines(t: Table) -> list[str]:
    """``t`` as calibrate prints it: its heading, the columns, a row a group."""
    return [t.heading, _header(), *(_row(group, f) for group, f in t.rows)]


def _header() -> str:
    return (
        f"  {'group':34s} {'n':>5s} {'pred/meas':>10s} {'error':>7s} "
        f"{'spearman':>9s} {'within 2x':>10s}"
    )


def _row(group: str, f: Fit) -> str:
    rho = "-" if f.spearman is None else f"{f.spearman:.2f}"
    return (
        f"  {shown(group)[:34]:34s} {f.n:5d} {_num(f.geomean):>10s} {_num(f.error):>6s}x "
        f"{rho:>9s} {_pct(f.within):>10s}"
    )


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f}%"


KIND_COLOURS = {
    "matmul": "#1f77b4",
    "conv": "#2ca02c",
    "elementwise": "#7f7f7f",
    "reduction": "#d62728",
    "pooling": "#9467bd",
    "attention": "#ff7f0e",
    "fused": "#17becf",
    "model": "#8c564b",
}


def pyplot():
    """matplotlib's pyplot drawing to files only (ImportError without it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gpu_colours(gpus: Sequence[str]) -> dict[str, tuple]:
    """One colour per GPU, up to 20 (tab20's strong shades first): the GPU
    charts hold twelve or more, past the default cycle's ten."""
    tab20 = pyplot().get_cmap("tab20").colors
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return {gpu: tab20[order[i % 20]] for i, gpu in enumerate(sorted(set(gpus)))}


def scatter(found: Sequence[Prediction], path: Path, title: str = "") -> None:
    """Predicted against measured, log-log, by kind, with the 1x and 2x lines
    (matplotlib; ImportError without it)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5), sharex=True, sharey=True)
    for ax, which in zip(axes, ("eager", "compile")):
        mine = [p for p in found if runtime_class(p.measurement.runtime) == which]
        for kind, colour in KIND_COLOURS.items():
            pts = [
                (p.measurement.time_us, p.predicted_us) for p in mine if p.measurement.kind == kind
            ]
            if pts:
                ax.scatter(*zip(*pts), s=9, c=colour, label=kind, alpha=0.7)
        values = [v for p in found for v in (p.predicted_us, p.measurement.time_us)] or [1, 10]
        lo, hi = min(values) / 2, max(values) * 2
        for factor, style in ((1, "-"), (2, ":"), (0.5, ":")):
            ax.plot([lo, hi], [lo * factor, hi * factor], "k" + style, linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
        ax.set_xlabel("measured (µs, published)")
        ax.set_title(f"{which}: {len(mine)} measurements")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("predicted (µs, cost model)")
    axes[1].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
