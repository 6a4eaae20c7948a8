"""The transfer study's table, its learning curves and the PCA of the features."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrate.calibrate.learn import Point, Sample
from orchestrate.calibrate.report import gpu_colours, pyplot
from orchestrate.cost.learned import CATEGORICAL, FEATURES
from orchestrate.text import shown


def text(points: Sequence[Point]) -> str:
    """Per GPU held out: the analytic fit on its rows, then the learned
    model's at each k (error factor, Spearman)."""
    ks = sorted({p.k for p in points})
    gpus = sorted({p.gpu for p in points})
    head = f"  {'GPU held out':16s} {'rows':>5s} {'analytic':>12s}" + "".join(
        f" {'k=' + str(k):>12s}" for k in ks
    )
    lines = [
        "leave one GPU out: trained on the others, adapted with k of its rows "
        "(chosen to cover its programs); error factor and Spearman on its other "
        "rows (means over the choices of k rows)",
        head,
    ]
    for gpu in gpus:
        mine = {p.k: p for p in points if p.gpu == gpu}
        first = mine[min(mine)]
        cells = "".join(
            f" {_cell(mine[k].error, mine[k].spearman):>12s}" if k in mine else f" {'-':>12s}"
            for k in ks
        )
        lines.append(
            f"  {shown(gpu)[:16]:16s} {first.n:5d} "
            f"{_cell(first.analytic_error, first.analytic_spearman):>12s}{cells}"
        )
    return "\n".join(lines) + "\n"


def _cell(error: float, rho: float | None) -> str:
    return f"{error:.2f}x {'-' if rho is None else f'{rho:.2f}'}"


def curves(points: Sequence[Point], path: Path) -> None:
    """Error factor and Spearman against k, one line per GPU held out (matplotlib)."""
    plt = pyplot()
    fig, (ax_e, ax_r) = plt.subplots(1, 2, figsize=(11, 4.5))
    colours = gpu_colours([p.gpu for p in points])
    for gpu, colour in colours.items():
        mine = sorted((p for p in points if p.gpu == gpu), key=lambda p: p.k)
        ks = [p.k for p in mine]
        line = ax_e.plot(ks, [p.error for p in mine], marker="o", label=gpu, color=colour)[0]
        ax_e.axhline(mine[0].analytic_error, color=line.get_color(), linestyle=":", linewidth=0.8)
        ax_r.plot(ks, [p.spearman or math.nan for p in mine], marker="o", color=line.get_color())
    ax_e.axhline(1.3, color="k", linewidth=0.8)
    ax_r.axhline(0.9, color="k", linewidth=0.8)
    ax_e.set(xlabel="k (rows of the held-out GPU)", ylabel="error factor", title="error")
    ax_r.set(xlabel="k (rows of the held-out GPU)", ylabel="Spearman", title="rank correlation")
    ax_e.legend(fontsize=7)
    fig.suptitle("learned cost model, leave one GPU out (dotted: the analytic model)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass(frozen=True)
class Pca:
    coords: np.ndarray  # (rows, 2)
    explained: tuple[float, float]  # share of the variance
    loadings: tuple[tuple[tuple[str, float], ...], ...]  # per component, largest first
    gpus: tuple[str, ...]  # per row


def pca(rows: Sequence[Sample]) -> Pca:
    """The two principal components of the standardised numeric features."""
    names = [f for f in FEATURES if f not in CATEGORICAL]
    cols = [FEATURES.index(f) for f in names]
    x = np.array([[s.x[c] for c in cols] for s in rows], dtype=np.float64)
    x = x - x.mean(axis=0)
    sd = x.std(axis=0)
    x = x / np.where(sd > 0, sd, 1.0)
    _, sv, vt = np.linalg.svd(x, full_matrices=False)
    var = sv**2 / max(float((sv**2).sum()), 1e-30)
    # the sign of a component is arbitrary: make its largest loading positive
    signs = np.sign(vt[np.arange(2), np.abs(vt[:2]).argmax(axis=1)])
    comps = vt[:2] * signs[:, None]
    loadings = tuple(
        tuple(sorted(zip(names, map(float, c)), key=lambda t: -abs(t[1]))[:4]) for c in comps
    )
    return Pca(x @ comps.T, (float(var[0]), float(var[1])), loadings, tuple(s.gpu for s in rows))


def pca_text(p: Pca) -> str:
    lines = [
        f"PCA of the numeric features: PC1 {100 * p.explained[0]:.0f}%, "
        f"PC2 {100 * p.explained[1]:.0f}% of the variance",
    ]
    for i, comp in enumerate(p.loadings):
        lines.append(f"  PC{i + 1}: " + ", ".join(f"{name} {weight:+.2f}" for name, weight in comp))
    lines.append("  GPU centroids (PC1, PC2):")
    for gpu in sorted(set(p.gpus)):
        mask = np.array([g == gpu for g in p.gpus])
        c = p.coords[mask].mean(axis=0)
        lines.append(f"    {shown(gpu)[:16]:16s} {c[0]:+.2f} {c[1]:+.2f}")
    return "\n".join(lines) + "\n"


def pca_plot(p: Pca, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5.5))
    for gpu, colour in gpu_colours(p.gpus).items():
        mask = np.array([g == gpu for g in p.gpus])
        ax.scatter(p.coords[mask, 0], p.coords[mask, 1], s=6, alpha=0.5, label=gpu, color=colour)
    ax.set(
        xlabel=f"PC1 ({100 * p.explained[0]:.0f}%)",
        ylabel=f"PC2 ({100 * p.explained[1]:.0f}%)",
        title="learned cost model: the feature space by GPU",
    )
    ax.legend(fontsize=7, markerscale=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
