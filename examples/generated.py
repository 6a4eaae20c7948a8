"""Generated graphs for planning at scale (``make bench-plan``).

    chain(n)  n elementwise nodes, each reading the one before (Mul and Add
              by one shared constant, Relu, Tanh, Sigmoid in turn): no cut
              point at all, the worst case for partitioning
    wide(n)   about n nodes in 100 parallel elementwise branches from one
              input, joined by a tree of Adds: many tensors live at once

Both on a 64x256 float32 tensor; sizes are ONNX nodes.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

SHAPE = (64, 256)
OPS = ("Mul", "Relu", "Add", "Tanh", "Sigmoid")
KINDS = ("chain", "wide")


def _node(op: str, src: str, out: str) -> onnx.NodeProto:
    ins = [src, "c"] if op in ("Add", "Mul") else [src]
    return helper.make_node(op, ins, [out], name=out)


def _model(name: str, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor("c", TensorProto.FLOAT, [], [0.5])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def chain(n: int) -> onnx.ModelProto:
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    return _model(f"chain{n}", [_node(OPS[i % len(OPS)], names[i], names[i + 1]) for i in range(n)])


def wide(n: int, width: int = 100) -> onnx.ModelProto:
    depth = max(1, n // width - 1)  # width * depth branch nodes, width - 1 Adds
    nodes, tails = [], []
    for b in range(width):
        src = "x"
        for i in range(depth):
            nodes.append(_node(OPS[(b + i) % len(OPS)], src, f"b{b}_{i}"))
            src = f"b{b}_{i}"
        tails.append(src)
    k = 0
    while len(tails) > 1:
        joined = []
        for a, b in zip(tails[::2], tails[1::2]):
            out = "y" if len(tails) == 2 else f"m{k}"
            nodes.append(helper.make_node("Add", [a, b], [out], name=out))
            joined.append(out)
            k += 1
        tails = joined + tails[len(joined) * 2 :]
    return _model(f"wide{n}", nodes)


def build(kind: str, n: int) -> onnx.ModelProto:
    if kind not in KINDS:
        raise ValueError(f"unknown generated graph {kind!r} (known: {', '.join(KINDS)})")
    return chain(n) if kind == "chain" else wide(n)
