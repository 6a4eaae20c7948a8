"""Write a primitive graph as a standard ONNX model.

Every primitive maps to one primitive-level ONNX operator (Add, Exp,
ReduceSum, MatMul, Conv, Transpose, Slice, ...), so onnxruntime can run the
result and Netron can show it.  Names of graph inputs and outputs are kept.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from orchestrate.ir import Graph, Node, Op

OPSET = 19
IR_VERSION = 9

# the ONNX operators the exported model may contain, and nothing else
PRIMITIVE_ONNX_OPS = frozenset(
    {
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Tanh",
        "Erf",
        "Sigmoid",
        "Neg",
        "Abs",
        "Sign",
        "Floor",
        "Ceil",
        "Round",
        "Sin",
        "Cos",
        "Not",
        "IsNaN",
        "IsInf",
        "Cast",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Max",
        "Min",
        "Mod",
        "Equal",
        "Less",
        "LessOrEqual",
        "And",
        "Or",
        "Xor",
        "Where",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ArgMax",
        "ArgMin",
        "CumSum",
        "Transpose",
        "Reshape",
        "Slice",
        "Concat",
        "Pad",
        "Expand",
        "Gather",
        "Identity",
        "MatMul",
        "Conv",
        "MaxPool",
        "AveragePool",
    }
)

_SIMPLE = {
    Op.EXP: "Exp",
    Op.LOG: "Log",
    Op.SQRT: "Sqrt",
    Op.RECIP: "Reciprocal",
    Op.TANH: "Tanh",
    Op.ERF: "Erf",
    Op.SIGMOID: "Sigmoid",
    Op.NEG: "Neg",
    Op.ABS: "Abs",
    Op.SIGN: "Sign",
    Op.FLOOR: "Floor",
    Op.CEIL: "Ceil",
    Op.ROUND: "Round",
    Op.SIN: "Sin",
    Op.COS: "Cos",
    Op.NOT: "Not",
    Op.ISNAN: "IsNaN",
    Op.ISINF: "IsInf",
    Op.ADD: "Add",
    Op.SUB: "Sub",
    Op.MUL: "Mul",
    Op.DIV: "Div",
    Op.POW: "Pow",
    Op.MAX: "Max",
    Op.MIN: "Min",
    Op.EQ: "Equal",
    Op.LT: "Less",
    Op.LE: "LessOrEqual",
    Op.AND: "And",
    Op.OR: "Or",
    Op.XOR: "Xor",
    Op.WHERE: "Where",
    Op.CONCAT: "Concat",
    Op.GATHER: "Gather",
    Op.IDENTITY: "Identity",
    Op.MATMUL: "MatMul",
}
_REDUCE = {Op.SUM: "ReduceSum", Op.RMAX: "ReduceMax", Op.RMIN: "ReduceMin", Op.PROD: "ReduceProd"}


def to_onnx(graph: Graph, *, name: str | None = None) -> onnx.ModelProto:
    """The ONNX model that computes what ``graph`` computes, op for op."""
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.asarray(a), k) for k, a in graph.constants.items()]
    aux: list[onnx.TensorProto] = []

    def const(stem: str, values, dtype=np.int64) -> str:
        cname = f"{stem}__{len(aux)}"
        aux.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), cname))
        return cname

    for n in graph.nodes:
        nodes.append(_node(n, graph, const))
    g = helper.make_graph(
        nodes,
        name or graph.name,
        [_info(i.name, i.type.shape, i.type.dtype) for i in graph.inputs],
        [_info(o, graph.types[o].shape, graph.types[o].dtype) for o in graph.outputs],
        initializer=inits + aux,
        value_info=[
            _info(n.name, n.shape, n.dtype) for n in graph.nodes if n.name not in graph.outputs
        ],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="orchestrate"
    )
    model.ir_version = IR_VERSION
    return model


def _info(name: str, shape, dtype: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _elem(dtype), list(shape))


def _elem(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _node(n: Node, graph: Graph, const) -> onnx.NodeProto:
    a, op, ins, out = n.attrs, n.op, list(n.inputs), [n.name]
    stem = n.name
    if op in _SIMPLE:
        kw = {"axis": a["axis"]} if op in (Op.CONCAT, Op.GATHER) else {}
        return helper.make_node(_SIMPLE[op], ins, out, **kw)
    if op is Op.CAST:
        return helper.make_node("Cast", ins, out, to=_elem(a["to"]))
    if op is Op.MOD:
        return helper.make_node("Mod", ins, out, fmod=int(a["fmod"]))
    if op in _REDUCE:
        axes = const(stem + "/axes", a["axes"])
        return helper.make_node(_REDUCE[op], ins + [axes], out, keepdims=int(a["keepdims"]))
    if op in (Op.ARGMAX, Op.ARGMIN):
        return helper.make_node(
            "ArgMax" if op is Op.ARGMAX else "ArgMin",
            ins,
            out,
            axis=a["axis"],
            keepdims=int(a["keepdims"]),
            select_last_index=int(a["select_last_index"]),
        )
    if op is Op.CUMSUM:
        axis = const(stem + "/axis", np.array(a["axis"], np.int64))
        return helper.make_node(
            "CumSum", ins + [axis], out, exclusive=int(a["exclusive"]), reverse=int(a["reverse"])
        )
    if op is Op.TRANSPOSE:
        return helper.make_node("Transpose", ins, out, perm=list(a["perm"]))
    if op is Op.RESHAPE:
        # allowzero: a 0 in the target shape means 0, not "copy this dim"
        shape = const(stem + "/shape", a["shape"])
        return helper.make_node("Reshape", ins + [shape], out, allowzero=1)
    if op is Op.EXPAND:
        return helper.make_node("Expand", ins + [const(stem + "/shape", a["shape"])], out)
    if op is Op.SLICE:
        starts, steps, shape = a["starts"], a["steps"], a["shape"]
        ends = [s + c * st for s, st, c in zip(starts, steps, shape)]
        ends = [e if e >= 0 else np.iinfo(np.int64).min for e in ends]
        extra = [
            const(stem + "/starts", starts),
            const(stem + "/ends", ends),
            const(stem + "/axes", range(len(starts))),
            const(stem + "/steps", steps),
        ]
        return helper.make_node("Slice", ins + extra, out)
    if op is Op.PAD:
        dtype = graph.types[n.inputs[0]].dtype
        extra = [const(stem + "/pads", a["pads"])]
        if a["mode"] == "constant":
            extra.append(const(stem + "/value", a["value"], np.dtype(dtype)))
        return helper.make_node("Pad", ins + extra, out, mode=a["mode"])
    if op is Op.CONV:
        w = graph.types[n.inputs[1]]
        return helper.make_node(
            "Conv",
            ins,
            out,
            kernel_shape=list(w.shape[2:]),
            strides=list(a["strides"]),
            pads=list(a["pads"]),
            dilations=list(a["dilations"]),
            group=a["group"],
        )
    if op is Op.POOL:
        kw = dict(kernel_shape=list(a["kernel"]), strides=list(a["strides"]), pads=list(a["pads"]))
        if a["kind"] == "max":
            return helper.make_node("MaxPool", ins, out, dilations=list(a["dilations"]), **kw)
        if any(d != 1 for d in a["dilations"]):
            kw["dilations"] = list(a["dilations"])
        return helper.make_node("AveragePool", ins, out, count_include_pad=1, **kw)
    raise AssertionError(f"no ONNX export for primitive {op}")


__all__ = ["to_onnx", "PRIMITIVE_ONNX_OPS", "OPSET"]
