"""`orchestrate inspect`: op counts and tensor sizes before and after fission."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import onnx
from onnx import helper

from orchestrate import ir


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} KB"


def inspection(model: onnx.ModelProto, graph: ir.Graph, source: str) -> dict:
    """A JSON-able summary of ``model`` and its primitive graph."""
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
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "inputs": {i.name: str(i.type) for i in graph.inputs},
        "outputs": {o: str(graph.types[o]) for o in graph.outputs},
        "onnx_nodes": len(model.graph.node),
        "onnx_ops": dict(sorted(before.items(), key=lambda kv: (-kv[1], kv[0]))),
        "weights_bytes": weights,
        "primitives": len(graph.nodes),
        "primitive_ops": dict(sorted(after.items(), key=lambda kv: (-kv[1], kv[0]))),
        "primitive_bytes": dict(after_bytes),
        "intermediate_bytes": sum(n.type.nbytes for n in graph.nodes),
        "constants_bytes": sum(int(a.nbytes) for a in graph.constants.values()),
        "largest": {"name": largest.name, "type": str(largest.type), "bytes": largest.type.nbytes}
        if largest
        else None,
    }


def format_inspection(info: dict) -> str:
    lines = [
        f"model     {info['model']}  (opset {info['opset']}, {info['onnx_nodes']} nodes, "
        f"weights {_mb(info['weights_bytes'])})",
        *(f"input     {k}: {v}" for k, v in info["inputs"].items()),
        *(f"output    {k}: {v}" for k, v in info["outputs"].items()),
        "",
        f"{'ONNX op':<24}{'count':>7}",
        *(f"{op:<24}{k:>7}" for op, k in info["onnx_ops"].items()),
        f"{'total':<24}{info['onnx_nodes']:>7}",
        "",
        f"{'primitive':<24}{'count':>7}{'bytes written':>16}",
        *(
            f"{op:<24}{k:>7}{_mb(info['primitive_bytes'][op]):>16}"
            for op, k in info["primitive_ops"].items()
        ),
        f"{'total':<24}{info['primitives']:>7}{_mb(info['intermediate_bytes']):>16}",
    ]
    if info["largest"]:
        big = info["largest"]
        lines.append(f"\nlargest tensor {big['name']!r}: {big['type']} ({_mb(big['bytes'])})")
    lines.append(f"constants after folding: {_mb(info['constants_bytes'])}")
    return "\n".join(lines)
