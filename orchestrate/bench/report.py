"""What a benchmark writes: a table, a JSON document (and its schema check), a chart.

The JSON document::

    {"device": str, "date": "YYYY-MM-DD", "commit": str, "torch": str, "triton": str,
     "onnxruntime": str, "clock": str, "interpreter": bool, "note": str,
     "models": [{"name", "dtype",
                 "latency_ms": {runtime: median ms | null}, "p10_ms": {...}, "p90_ms": {...},
                 "roofline_ms": float, "roofline_bound": "memory" | "compute",
                 "roofline_device": str, "roofline_fraction": {runtime: floor / median | null},
                 "peak_mem_mb": {runtime: MiB | null}, "compile_s": {runtime: s | null},
                 "unavailable": {runtime: why}, "notes": {runtime: how it ran, or why no memory},
                 "kernels": int, "verified": bool | null, "verify_note": str,
                 "verify_errors": {output: {"rel", "max_abs", "ok"}},
                 "untrusted": {runtime: why its time is not to be trusted}}],
     "skipped": [{"name", "dtype", "reason"}]}

A runtime that could not run has null figures and its reason under
``unavailable``: the document always says why a number is missing.  The
bundle's time is trusted only when its answer verified: a wrong or
unchecked answer keeps its figures, marked under ``untrusted`` with why.
"""

from __future__ import annotations

import datetime
import math
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrate.bench.run import ModelResult
from orchestrate.bench.runtimes import KEYS

INTERPRETER_NOTE = (
    "no GPU: the bundle ran in Triton's interpreter and every runtime on the CPU; "
    "these times say nothing about GPU speed"
)


def model_record(r: ModelResult) -> dict:
    """One entry of ``models``."""
    rec: dict = {"name": r.name, "dtype": r.dtype or "model"}
    for field in (
        "latency_ms",
        "p10_ms",
        "p90_ms",
        "roofline_fraction",
        "peak_mem_mb",
        "compile_s",
        "unavailable",
        "notes",
    ):
        rec[field] = {}
    rec["shapes"] = dict(r.shapes)
    if r.binding:
        rec["binding"] = r.binding
    rec["roofline_ms"] = _r(r.floor.ms)
    rec["roofline_bound"] = r.floor.bound
    rec["roofline_device"] = r.floor.device
    for m in r.measured:
        s = m.stats
        rec["latency_ms"][m.key] = _r(s.median) if s else None
        rec["p10_ms"][m.key] = _r(s.p10) if s else None
        rec["p90_ms"][m.key] = _r(s.p90) if s else None
        rec["roofline_fraction"][m.key] = _r(r.floor.ms / s.median) if s and s.median else None
        rec["peak_mem_mb"][m.key] = _r(m.peak_mem_mb) if m.peak_mem_mb is not None else None
        rec["compile_s"][m.key] = _r(m.ready_s) if m.ready_s is not None else None
        if m.reason:
            rec["unavailable"][m.key] = m.reason
        note = "; ".join(x for x in (m.note, m.memory_note and f"memory: {m.memory_note}") if x)
        if note:
            rec["notes"][m.key] = note
    rec["kernels"] = r.kernels
    rec["verified"] = r.verified
    rec["verify_note"] = r.verify_note
    rec["verify_errors"] = dict(r.verify_errors)
    rec["untrusted"] = {}
    base = r.get("orchestrate")
    if base is not None and base.stats is not None and r.verified is not True:
        rec["untrusted"]["orchestrate"] = (
            f"its answer did not verify: {r.verify_note}"
            if r.verified is False
            else f"its answer was not verified{': ' + r.verify_note if r.verify_note else ''}"
        )
    return rec


def document(
    models: Sequence[dict],
    *,
    device: str,
    clock: str,
    interpreter: bool,
    skipped: Sequence[dict] = (),
    date: str | None = None,
) -> dict:
    """The whole results document around ``models`` (``model_record``s)."""
    return {
        "device": device,
        "date": date or datetime.date.today().isoformat(),
        "commit": commit(),
        **versions(),
        "clock": clock,
        "interpreter": interpreter,
        "note": INTERPRETER_NOTE if interpreter else "GPU timings",
        "models": list(models),
        "skipped": list(skipped),
    }


def versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "triton", "onnxruntime"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "not installed"
    out["python"] = platform.python_version()
    return out


def commit() -> str:
    """The checkout's commit (with ``+dirty`` for uncommitted changes), or
    ``unknown`` outside a git checkout."""
    here = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=here,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("+dirty" if dirty else "")) if sha else "unknown"


def _r(x: float) -> float:
    return float(f"{x:.6g}")


# -- the schema, checked ---------------------------------------------------------------------

TOP = {"device": str, "date": str, "commit": str, "torch": str, "triton": str, "models": list}
PER_RUNTIME = ("latency_ms", "p90_ms", "peak_mem_mb", "compile_s")


def check_document(doc) -> list[str]:
    """Every way ``doc`` departs from the schema above (empty when it keeps it)."""
    if not isinstance(doc, Mapping):
        return ["the document is not an object"]
    problems = [
        f"{k}: missing or not a {t.__name__}"
        for k, t in TOP.items()
        if not isinstance(doc.get(k), t)
    ]
    for i, m in enumerate(doc.get("models") or []):
        where = f"models[{i}]"
        if not isinstance(m, Mapping):
            problems.append(f"{where}: not an object")
            continue
        where = f"{where} ({m.get('name')}, {m.get('dtype')})"
        for k, t in (("name", str), ("dtype", str), ("kernels", int)):
            if not isinstance(m.get(k), t):
                problems.append(f"{where}.{k}: missing or not a {t.__name__}")
        if not _number(m.get("roofline_ms")):
            problems.append(f"{where}.roofline_ms: missing or not a number")
        if not isinstance(m.get("verified"), bool | None):
            problems.append(f"{where}.verified: not true, false or null")
        why = m.get("unavailable") if isinstance(m.get("unavailable"), Mapping) else {}
        for field in PER_RUNTIME:
            values = m.get(field)
            if not isinstance(values, Mapping):
                problems.append(f"{where}.{field}: missing or not an object")
                continue
            for rt, v in values.items():
                if rt not in KEYS:
                    problems.append(f"{where}.{field}.{rt}: unknown runtime")
                elif v is not None and not _number(v):
                    problems.append(f"{where}.{field}.{rt}: not a number or null")
        latency = m.get("latency_ms") if isinstance(m.get("latency_ms"), Mapping) else {}
        if "orchestrate" not in latency:
            problems.append(f"{where}.latency_ms: no orchestrate entry")
        for rt, v in latency.items():
            if v is None and not why.get(rt):
                problems.append(f"{where}: {rt} has no latency and no reason under unavailable")
    return problems


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# -- the table --------------------------------------------------------------------------------


def _shapes(shapes: dict) -> str:
    return ", ".join(
        f"{name}={'x'.join(map(str, dims)) or 'scalar'}" for name, dims in shapes.items()
    )


def table(r: ModelResult, interpreter: bool) -> list[str]:
    """The screen table of one model."""
    base = r.get("orchestrate")
    base_ms = base.stats.median if base and base.stats else None
    head = (
        f"{'runtime':<34}{'median ms':>11}{'p10 ms':>9}{'p90 ms':>9}{'vs orchestrate':>16}"
        f"{'of floor':>10}{'peak MiB':>10}{'ready s':>9}"
    )
    lines = [
        f"{r.name} ({r.dtype or 'model precision'}): {r.kernels} kernels, roofline floor "
        f"{r.floor.ms:.4g} ms on {r.floor.device} ({r.floor.bound}-bound)",
        *(
            [f"timed at {_shapes(r.shapes)}" + (f" ({r.binding})" if r.binding else "")]
            * bool(r.shapes)
        ),
        head,
    ]
    for m in r.measured:
        if m.stats is None:
            lines.append(f"{m.label:<34}unavailable: {m.reason}")
            continue
        s = m.stats
        rel = f"{s.median / base_ms:.3g}x" if base_ms else "-"
        mem = f"{m.peak_mem_mb:.1f}" if m.peak_mem_mb is not None else "-"
        ready = f"{m.ready_s:.1f}" if m.ready_s is not None else "-"
        frac = f"{r.floor.ms / s.median:.2g}" if s.median else "-"
        lines.append(
            f"{m.label:<34}{s.median:>11.3f}{s.p10:>9.3f}{s.p90:>9.3f}{rel:>16}"
            f"{frac:>10}{mem:>10}{ready:>9}"
        )
    if interpreter:
        lines.append(INTERPRETER_NOTE)
    else:
        lines.append(
            "peak MiB is what torch's allocator held; - where it cannot see "
            "(onnxruntime's own arena)"
        )
    return lines


# -- the chart --------------------------------------------------------------------------------

COLOURS = {
    "orchestrate": "#1b9e77",
    "torch-eager": "#999999",
    "torch-compile": "#7570b3",
    "torch-compile-max-autotune": "#e7298a",
    "onnxruntime-cuda": "#d95f02",
    "onnxruntime-cpu": "#e6ab02",
}


def chart(doc: Mapping, path: str | Path) -> str:
    """A PNG of every model's median latency per runtime (log scale, p10-p90
    whiskers) with its roofline floor; returns a one-line message (the file
    written, or why not: matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no chart: matplotlib is not installed (pip install matplotlib) for {path}"
    models = list(doc["models"])
    if not models:
        return "no chart: no model was measured"
    runtimes = [k for k in KEYS if any(m["latency_ms"].get(k) is not None for m in models)]
    width = 0.8 / max(1, len(runtimes))
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(models) + 3), 5.5))
    for j, rt in enumerate(runtimes):
        xs, ys, lo, hi = [], [], [], []
        for i, m in enumerate(models):
            v = m["latency_ms"].get(rt)
            if v is not None:
                xs.append(i + (j - (len(runtimes) - 1) / 2) * width)
                ys.append(v)
                lo.append(max(0.0, v - (m["p10_ms"].get(rt) or v)))
                hi.append(max(0.0, (m["p90_ms"].get(rt) or v) - v))
        ax.bar(xs, ys, width, label=rt, color=COLOURS.get(rt), yerr=[lo, hi], capsize=2)
    for i, m in enumerate(models):
        ax.hlines(
            m["roofline_ms"],
            i - 0.45,
            i + 0.45,
            colors="black",
            linestyles="dashed",
            label="roofline floor" if i == 0 else None,
        )
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([f"{m['name']}\n{m['dtype']}" for m in models], fontsize=8)
    ax.set_ylabel("median latency, ms (log; whiskers p10-p90)")
    title = f"{doc['device']}, {doc['date']}, commit {doc['commit']}"
    if doc.get("interpreter"):
        title += "\nTriton interpreter / CPU timings: they say nothing about GPU speed"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncols=min(4, len(runtimes) + 1), loc="upper left")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


# -- the Markdown page ------------------------------------------------------------------------

SHORT = {
    "orchestrate": "orchestrate",
    "torch-eager": "eager",
    "torch-compile": "torch.compile",
    "torch-compile-max-autotune": "max-autotune",
    "onnxruntime-cuda": "ort CUDA",
    "onnxruntime-cpu": "ort CPU",
}


def markdown(doc: Mapping) -> str:
    """``doc`` as a page a reader takes in at once: median latency per
    runtime with the bundle's speed-up over each, its verdict and error,
    peak memory and time to ready, then every missing or untrusted figure
    with why.  Rewritten with ``results.json`` as figures arrive."""
    models = list(doc.get("models", []))
    runtimes = [k for k in KEYS if any(k in m["latency_ms"] for m in models)]
    head = f"# {doc['device']}, {doc['date']}, commit {doc['commit']}"
    lines = [
        head,
        "",
        f"{doc['note']}; clock: {doc['clock']}; torch {doc['torch']}, triton {doc['triton']}.",
        "",
    ]

    def ms(v):
        return "-" if v is None else f"{v:.4g}"

    cols = ["model", "dtype", "kernels", "verified", *(SHORT[k] + " ms" for k in runtimes)]
    cols += [f"x vs {SHORT[k]}" for k in runtimes if k != "orchestrate"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for m in models:
        lat = m["latency_ms"]
        mine = lat.get("orchestrate")
        worst = max((e["rel"] for e in m.get("verify_errors", {}).values()), default=None)
        verdict = {True: "yes", False: "**NO**", None: "not checked"}[m["verified"]]
        if worst is not None:
            verdict += f" (rel {worst:.2g})"
        row = [m["name"], m["dtype"], str(m["kernels"]), verdict]
        row += [ms(lat.get(k)) + ("*" if k in m.get("untrusted", {}) else "") for k in runtimes]
        row += [
            "-" if not (mine and lat.get(k)) else f"{lat[k] / mine:.2f}"
            for k in runtimes
            if k != "orchestrate"
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "x vs R: R's median over the bundle's (above 1: the bundle is faster). "
        "* untrusted (below).",
        "",
    ]
    cols = ["model", *(f"{SHORT[k]} MiB / ready s" for k in runtimes)]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for m in models:
        row = [m["name"]]
        for k in runtimes:
            mem, ready = m["peak_mem_mb"].get(k), m["compile_s"].get(k)
            row.append(
                f"{'-' if mem is None else f'{mem:.0f}'} / "
                f"{'-' if ready is None else f'{ready:.1f}'}"
            )
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Peak MiB: the most memory torch's allocator held from the runtime's start "
        "(weights included); ready s: seconds until its first answer.",
        "",
    ]
    notes = []
    for m in models:
        for k, why in m.get("untrusted", {}).items():
            notes.append(f"- {m['name']} {SHORT.get(k, k)}: untrusted: {why}")
        for k, why in m.get("unavailable", {}).items():
            notes.append(f"- {m['name']} {SHORT.get(k, k)}: {why}")
    notes += [
        f"- {s['name']} {s.get('dtype', '')}: skipped: {s['reason']}"
        for s in doc.get("skipped", [])
    ]
    if notes:
        lines += ["## Missing and untrusted figures", "", *notes, ""]
    return "\n".join(lines)
