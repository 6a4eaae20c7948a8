"""`orchestrate inspect`: op counts and tensor sizes before and after fission."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import onnx
from onnx import helper

from orchestrate import ir
from orchestrate.frontend import opset_of
from orchestrate.text import shown


def _mb(nbytes: int) -> str:
    if nbytes < 1e5:
        return f"{nbytes / 1e3:.1f} KB"
    for unit, scale in (("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        if nbytes < 1e4 * scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes / 1e15:,.2f} PB"


def _row(*cells: tuple[object, str]) -> str:
    """Cells formatted to their widths, two spaces apart, so that a value
    wider than its column never runs into the next one."""
    return "  ".join(f"{v:{w}}" for v, w in cells).rstrip()


def inspection(
    model: onnx.ModelProto, graph: ir.Graph, source: str, dtype: str | None = None
) -> dict:
    """A JSON-able summary of ``model`` and its primitive graph (run at
    ``dtype``, the ``--dtype`` it was lowered to; None: the model's own)."""
    before = Counter(n.op_type for n in model.graph.node)
    weights = sum(
        int(np.prod(t.dims)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in model.graph.initializer
    )
    after: Counter[str] = Counter()
    after_bytes: dict[str, int] = defaultdict(int)
    for n in graph.nodes:
        after[n.op.value] += 1
        after_bytes[n.op.value] += n.type.nbytes
    largest = max(graph.nodes, key=lambda n: n.type.nbytes, default=None)
    return {
        "model": source,
        "opset": opset_of(model),
        "inputs": {i.name: str(i.type) for i in graph.inputs},
        "outputs": {o: str(graph.types[o]) for o in graph.outputs},
        "onnx_nodes": len(model.graph.node),
        "onnx_ops": dict(sorted(before.items(), key=lambda kv: (-kv[1], kv[0]))),
        "weights_bytes": weights,
        "primitives": len(graph.nodes),
        "primitive_ops": dict(sorted(after.items(), key=lambda kv: (-kv[1], kv[0]))),
        "primitive_bytes": dict(after_bytes),
        "dtype": dtype,
        "primitive_dtypes": dict(sorted(Counter(n.dtype for n in graph.nodes).items())),
        "intermediate_bytes": sum(n.type.nbytes for n in graph.nodes),
        "constants_bytes": sum(int(a.nbytes) for a in graph.constants.values()),
        "largest": {"name": largest.name, "type": str(largest.type), "bytes": largest.type.nbytes}
        if largest
        else None,
    }


def format_inspection(info: dict) -> str:
    lines = [
        f"model     {shown(info['model'])}  (opset {info['opset']}, {info['onnx_nodes']} nodes, "
        f"weights {_mb(info['weights_bytes'])})",
        *(f"input     {shown(k)}: {v}" for k, v in info["inputs"].items()),
        *(f"output    {shown(k)}: {v}" for k, v in info["outputs"].items()),
        "",
        _row(("ONNX op", "<24"), ("count", ">5")),
        *(_row((shown(op), "<24"), (k, ">5")) for op, k in info["onnx_ops"].items()),
        _row(("total", "<24"), (info["onnx_nodes"], ">5")),
        "",
        _row(("primitive", "<24"), ("count", ">5"), ("bytes written", ">14")),
        *(
            _row((op, "<24"), (k, ">5"), (_mb(info["primitive_bytes"][op]), ">14"))
            for op, k in info["primitive_ops"].items()
        ),
        _row(
            ("total", "<24"), (info["primitives"], ">5"), (_mb(info["intermediate_bytes"]), ">14")
        ),
    ]
    if info["largest"]:
        big = info["largest"]
        lines.append(f"\nlargest tensor {big['name']!r}: {big['type']} ({_mb(big['bytes'])})")
    lines.append(f"constants after folding: {_mb(info['constants_bytes'])}")
    if info["dtype"] is not None:  # --dtype given
        dtypes = ", ".join(f"{n} {d}" for d, n in info["primitive_dtypes"].items())
        lines.append(f"precision: {info['dtype']} (primitives: {dtypes})")
    return "\n".join(lines)
