"""`orchestrate explain --picture`: the plan's kernels as a Graphviz graph.

One box per kernel (reshape views draw nothing: their edges pass through),
labelled with its name, template, predicted time and what bounds it
(memory, compute, latency or launch: the cost model's ``bound``).  An edge
is the tensors one kernel writes and another reads, labelled with their
bytes; graph inputs and outputs are small nodes at the ends, and the weights
a kernel reads are a count in its box (``+2 weights``), not nodes.

The graph runs left to right.  When the plan's kernels repeat a block (a
transformer's layers: the same structural hashes in the same order), each
repetition is its own row, the first drawn in full and the others as small
boxes (name and time), so a 24-layer decoder reads as a table of layers
rather than a strip a few hundred boxes long.

Why Graphviz: DOT is plain text, needs no Python dependency, and the same
plan gives the same file; ``dot`` does the layered (Sugiyama) layout a
dataflow graph wants and renders SVG, PNG and PDF; it has been kept since
1991 and every package manager has it.  A ``--picture`` ending in ``.svg``,
``.png`` or ``.pdf`` is rendered by ``dot`` where it is installed; without
it, or for any other name, the DOT text is written (``dot -Tsvg F.dot -o
F.svg`` renders it anywhere).

Every string from the model (graph, tensor and weight names) is hostile:
it reaches the DOT text only through ``quote``.  All times are the cost
model's predictions, and the picture says so.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrate import text
from orchestrate.errors import OrchestrateError
from orchestrate.explain import _bytes
from orchestrate.ir import TensorType
from orchestrate.plan import Plan, PlannedKernel

RENDERED = {".svg": "svg", ".png": "png", ".pdf": "pdf"}  # suffix -> dot -T format

# fill colour per template; any other template gets OTHER
COLOURS = {
    "matmul": "#a6cee3",
    "attention": "#fdbf6f",
    "conv": "#b2df8a",
    "row_reduce": "#fb9a99",
    "pointwise": "#e0e0e0",
    "window": "#cab2d6",
    "merged_matmul": "#8dd3c7",
    "norm_matmul": "#bebada",
    "norm_merged_matmul": "#bc80bd",
    "low_rank": "#80b1d3",
    "library_matmul": "#d9d9d9",
    "library_conv": "#ccebc5",
    "library_attention": "#ffed6f",
}
OTHER = "#ffffb3"
NAME_CHARS = 28  # longest name drawn in a label; the tooltip has it whole


def quote(*lines: str) -> str:
    """The one way text reaches the DOT file: a double-quoted DOT string of
    ``lines``.  Unprintable characters (a newline inside a name) become
    visible escapes, so that one name is one line; backslashes and quotes
    are escaped for DOT; ``&`` is written ``&amp;`` because Graphviz reads
    HTML entities in every label."""
    out = []
    for line in lines:
        line = text.shown(line)
        out.append(line.replace("&", "&amp;").replace("\\", "\\\\").replace('"', '\\"'))
    return '"' + "\\n".join(out) + '"'


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"


def _type(types, t: str) -> str:
    shape, dtype = types[t]
    return f"{dtype}[{'x'.join(map(str, shape))}]"


@dataclass(frozen=True)
class Rows:
    """Kernels (indices into the drawn list) grouped into rows: ``start`` is
    where a block of ``period`` kernels begins that repeats ``repeats`` times."""

    start: int
    period: int
    repeats: int


def repeated_block(hashes: Sequence[str], crossing=lambda cut: 0) -> Rows | None:
    """The block of kernels repeated back to back that covers the most
    kernels (the shortest such block on a tie), or None if nothing of two or
    more kernels repeats.  For each period p, runs of ``h[i] == h[i + p]``
    give the repeats at each start: O(n²) for n kernels.

    Where a block of period p starts is a choice: any of p neighbouring
    starts repeat (at most one repetition fewer).  The one taken is where
    ``crossing(cut)``, the edges from before kernel ``cut`` to it or after,
    is least (a transformer's layer boundary is the residual stream alone),
    then the most repeats, then the earliest."""
    n, best, reps = len(hashes), None, {}
    for p in range(n // 2, 1, -1):  # longest first: on a tie the shorter period wins
        run, at = 0, [1] * n
        for i in range(n - p - 1, -1, -1):  # run: matches from i onwards
            run = run + 1 if hashes[i] == hashes[i + p] else 0
            at[i] = run // p + 1
            if at[i] >= 2 and (best is None or at[i] * p >= best.repeats * best.period):
                best = Rows(i, p, at[i])
        reps[p] = at
    if best is None:
        return None
    at = reps[best.period]
    starts = [
        i
        for i in range(best.start, min(n, best.start + best.period))
        if at[i] >= max(2, best.repeats - 1)
    ]
    start = min(starts, key=lambda i: (crossing(i), -at[i], i))
    return Rows(start, best.period, at[start])


def dot(result: Plan) -> str:
    """The plan's kernels as DOT text (see the module doc)."""
    types = result.types
    inputs = [i.name for i in result.graph.inputs]
    constants = set(result.graph.constants)
    drawn = [k for k in result.kernels if not k.is_view]
    node = {k.name: k.name.split("_", 1)[0] for k in drawn}  # k012_matmul -> k012
    producer: dict[str, str] = {}  # tensor -> the DOT node that writes it
    for k in drawn:
        for t in k.outputs:
            producer.setdefault(t, node[k.name])
    for i, t in enumerate(inputs):
        producer[t] = f"in{i}"
    aliases = {
        t: [i for i in k.inputs if i not in constants]
        for k in result.kernels
        if k.is_view
        for t in k.outputs
    }

    def sources(t: str, seen=()) -> list[str]:
        """The DOT nodes whose tensors ``t`` is, through any views."""
        if t in producer:
            return [producer[t]]
        if t in aliases and t not in seen:
            return [s for a in aliases[t] for s in sources(a, (*seen, t))]
        return []

    index = {node[k.name]: j for j, k in enumerate(drawn)}
    links = [
        (index[src], j)
        for j, k in enumerate(drawn)
        for t in k.inputs
        for src in sources(t)
        if src in index
    ]
    rows = repeated_block([k.hash for k in drawn], lambda cut: sum(a < cut <= b for a, b in links))
    row_of: dict[str, int] = {}  # kernel -> row: 0 before the block, 1.. repeats, then after
    for j, k in enumerate(drawn):
        if rows is None or j < rows.start:
            row_of[k.name] = 0
        else:
            row_of[k.name] = min(1 + (j - rows.start) // rows.period, rows.repeats + 1)
    # repetitions after the first are drawn small
    small = {k.name for k in drawn if rows and 2 <= row_of[k.name] <= rows.repeats}

    s = result.summary
    title = (
        f"{result.graph.name}: {s.kernels} kernels (+{s.views} views) on {result.device}, "
        f"{s.predicted_us:,.2f} µs predicted; times and bounds are the cost model's "
        "predictions, not measurements"
    )
    out = [
        "digraph plan {",
        f"  graph [rankdir=LR, label={quote(title)}, labelloc=t, fontname=Helvetica, "
        "fontsize=11, nodesep=0.08, ranksep=0.22, newrank=true];",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=9, '
        'margin="0.05,0.02", height=0.3];',
        '  edge [fontname=Helvetica, fontsize=7, arrowsize=0.5, color="#888888", '
        'fontcolor="#555555"];',
    ]
    for i, t in enumerate(inputs):
        out.append(
            f'  in{i} [shape=ellipse, fillcolor="#ffffff", fontsize=8, '
            f"label={quote(_short(t), _type(types, t))}, tooltip={quote(t)}];"
        )

    def box(k: PlannedKernel) -> str:
        weights = [t for t in k.inputs if t in constants]
        colour = COLOURS.get(k.template, OTHER)
        tip = (
            f"{k.name}: {k.template}, {_bytes(k.bytes)} moved, {k.flops:,} flops, "
            f"{k.predicted_us:,.2f} µs predicted, {k.bound}-bound; "
            f"{len(k.primitives)} primitives; weights: {', '.join(weights[:8]) or 'none'}"
            + (f" and {len(weights) - 8} more" if len(weights) > 8 else "")
        )
        if k.name in small:
            label = quote(node[k.name], f"{k.predicted_us:,.1f} µs")
            return (
                f"  {node[k.name]} [label={label}, fillcolor={quote(colour)}, fontsize=7, "
                f"height=0.2, tooltip={quote(tip)}];"
            )
        lines = [
            f"{node[k.name]} {k.template}",
            f"{k.predicted_us:,.2f} µs predicted",
            f"{k.bound}-bound",
        ]
        if weights:
            lines[-1] += f", +{len(weights)} weight{'s' * (len(weights) > 1)}"
        return f"  {node[k.name]} [label={quote(*lines)}, fillcolor={quote(colour)}, tooltip={quote(tip)}];"

    n_rows = max(row_of.values(), default=0) + 1
    for r in range(n_rows):
        members = [k for k in drawn if row_of[k.name] == r]
        if not members:
            continue
        if rows is None:
            out += [box(k) for k in members]
            continue
        name = (
            "before the repeated block"
            if r == 0
            else "after the repeated block"
            if r > rows.repeats
            else f"block {r} of {rows.repeats}" + (" (same kernels as block 1)" if r > 1 else "")
        )
        out.append(f"  subgraph cluster_{r} {{")
        out.append(
            f'    graph [label={quote(name)}, labeljust=l, fontsize=8, style=rounded, color="#cccccc"];'
        )
        out += ["  " + box(k) for k in members]
        out.append("  }")

    def edge(src: str, dst: str, tensors: list[str], same_row: bool, labelled: bool) -> str:
        """An edge labelled with the bytes of the tensors it passes (in a
        repeated row only its tooltip says: block 1 shows the same edges)."""
        size = sum(TensorType(*types[t]).nbytes for t in tensors)
        what = ", ".join(f"{t} {_type(types, t)}" for t in tensors)
        attrs = f"tooltip={quote(f'{_bytes(size)}: {what}')}"
        if labelled:
            attrs = f"label={quote(_bytes(size))}, {attrs}"
        return f"  {src} -> {dst} [{attrs}{'' if same_row else ', constraint=false'}];"

    row_at = {node[k.name]: row_of[k.name] for k in drawn}
    first_use: dict[str, int] = {}
    for k in drawn:
        passed: dict[str, list[str]] = {}
        for t in k.inputs:
            for src in sources(t):
                if t not in passed.setdefault(src, []):
                    passed[src].append(t)
        for src, tensors in passed.items():
            if src.startswith("in"):  # an input constrains the layout of its first row only
                same = first_use.setdefault(src, row_of[k.name]) == row_of[k.name]
            else:
                same = row_at[src] == row_of[k.name]
            out.append(edge(src, node[k.name], tensors, same, k.name not in small))
    for i, t in enumerate(result.graph.outputs):
        out.append(
            f'  out{i} [shape=ellipse, fillcolor="#ffffff", fontsize=8, '
            f"label={quote(_short(t), _type(types, t))}, tooltip={quote(t)}];"
        )
        for src in sources(t):
            out.append(edge(src, f"out{i}", [t], True, True))
    out.append("}")
    return "\n".join(out) + "\n"


def target(path: Path) -> Path:
    """Where ``--picture path`` writes: ``path``, or its ``.dot`` sibling
    when ``path`` asks for a rendering and ``dot`` is not installed."""
    if path.suffix.lower() in RENDERED and shutil.which("dot") is None:
        return path.with_suffix(".dot")
    return path


def picture(result: Plan, path: Path) -> bytes:
    """The bytes to write at ``path`` (a ``target``): rendered by ``dot``
    for .svg, .png and .pdf, the DOT text otherwise."""
    text = dot(result)
    fmt = RENDERED.get(path.suffix.lower())
    if fmt is None:
        return text.encode()
    exe = shutil.which("dot")
    if exe is None:
        raise OrchestrateError(f"{path}: rendering needs Graphviz's dot, which is not installed")
    try:
        done = subprocess.run(
            [exe, f"-T{fmt}"], input=text.encode(), capture_output=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OrchestrateError(f"{path}: dot failed to render the picture ({e})") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise OrchestrateError(
            f"{path}: dot failed to render the picture ({why[-1] if why else done.returncode})"
        )
    return done.stdout
