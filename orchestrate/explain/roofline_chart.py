"""`orchestrate explain --roofline`: the plan's kernels on the device's roofline.

x is arithmetic intensity (flops per byte moved through device memory, log
scale), y the performance each kernel attains by the cost model (its flops
over its predicted time, TFLOP/s, log scale): one point per kernel, coloured
by template.  The roofs are the same figures the cost model uses: the
achievable bandwidth (``ACHIEVABLE_BANDWIDTH`` of the datasheet, the slope),
the CUDA-core fp32 peak, and the tensor-core peaks at
``TENSOR_CORE_EFFICIENCY`` (``devices.py``, ``cost/figures.py``).  A point
far under every roof is latency- or launch-bound: the roofline has no term
for either.  Everything on the chart is a prediction, and its title says so.

matplotlib draws it: the plotting library every Python user already knows,
kept for two decades, that writes PNG, SVG and PDF.  It is an optional
dependency (``pip install 'orchestrate[charts]'``); without it ``--roofline``
is one line saying so.  Kernels with no flops (copies, gathers) have no
intensity and are counted in the caption instead.
"""

from __future__ import annotations

import io
from pathlib import Path

from orchestrate.cost.devices import get_device
from orchestrate.cost.figures import ACHIEVABLE_BANDWIDTH, TENSOR_CORE_EFFICIENCY
from orchestrate.errors import InputError
from orchestrate.explain.picture import COLOURS, OTHER
from orchestrate.plan import Plan

FORMATS = ("png", "svg", "pdf")


def check(path: Path) -> None:
    """Refuse, before any work, a chart that cannot be drawn."""
    if path.suffix.lower()[1:] not in FORMATS:
        raise InputError(f"--roofline {path}: name a .png, .svg or .pdf file")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            "--roofline needs matplotlib, an optional dependency: pip install 'orchestrate[charts]'"
        ) from None


def chart(result: Plan, fmt: str = "png") -> bytes:
    """The roofline chart of ``result``'s kernels as a ``fmt`` file."""
    from matplotlib.figure import Figure

    device = get_device(result.device)
    bandwidth = device.bandwidth_gbs * ACHIEVABLE_BANDWIDTH / 1e3  # TB/s = TFLOP/s per flop/byte
    roofs = [(f"fp32 CUDA cores {device.fp32_tflops:g}", device.fp32_tflops)]
    for name, peak in (("tf32", device.tf32_tflops), ("fp16/bf16", device.fp16_tflops)):
        if peak > device.fp32_tflops:
            roofs.append(
                (
                    f"{name} tensor cores {peak:g} x {TENSOR_CORE_EFFICIENCY:g}",
                    peak * TENSOR_CORE_EFFICIENCY,
                )
            )
    kernels = [k for k in result.kernels if not k.is_view]
    shown = [k for k in kernels if k.flops > 0 and k.bytes > 0 and k.predicted_us > 0]

    fig = Figure(figsize=(8, 5.5), dpi=110)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [k.flops / k.bytes for k in shown] or [1.0]
    lo, hi = min(xs + [0.1]) / 2, max(xs + [2 * max(p for _, p in roofs) / bandwidth]) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(
        grid,
        [bandwidth * x for x in grid],
        color="#555555",
        lw=1,
        ls="--",
        label=f"memory {bandwidth:.2f} TB/s ({ACHIEVABLE_BANDWIDTH:g} of datasheet)",
    )
    for (label, peak), style in zip(roofs, ("-", "-.", ":")):
        ax.plot(
            grid,
            [min(peak, bandwidth * x) for x in grid],
            color="#222222",
            lw=1.2,
            ls=style,
            label=f"{label} TFLOP/s",
        )
    for template in sorted({k.template for k in shown}):
        ks = [k for k in shown if k.template == template]
        ax.scatter(
            [k.flops / k.bytes for k in ks],
            [k.flops / k.predicted_us / 1e6 for k in ks],  # flop/µs -> TFLOP/s
            s=22,
            color=COLOURS.get(template, OTHER),
            edgecolors="#333333",
            linewidths=0.6,
            label=f"{template} ({len(ks)})",
            zorder=3,
        )
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (flops per byte of device memory)")
    ax.set_ylabel("predicted performance (TFLOP/s = flops / predicted time)")
    s = result.summary
    ax.set_title(
        f"{result.graph.name} on {device.label}: {len(kernels)} kernels, "
        f"{s.predicted_us:,.1f} µs predicted\n"
        "PREDICTED by the cost model, not measured",
        fontsize=10,
    )
    left = len(kernels) - len(shown)
    if left:
        fig.text(
            0.01,
            0.01,
            f"{left} kernels without flops (copies, gathers) are not shown",
            fontsize=7,
            color="#555555",
        )
    ax.grid(True, which="major", lw=0.3, color="#dddddd")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = io.BytesIO()
    metadata = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}
    fig.savefig(out, format=fmt, metadata=metadata[fmt])
    return out.getvalue()
