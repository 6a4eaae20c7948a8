"""The ONNX nodes that PyTorch ran as one op.

A measurement row's graph is what ``torch.onnx.export`` wrote at opset 17,
and the exporter writes some single PyTorch ops as several nodes: ``F.gelu``
as Div, Erf, Add, Mul, Mul (ONNX has ``Gelu`` only from opset 20),
``F.mish`` as Softplus, Tanh, Mul (``Mish`` from opset 18), ``nn.GroupNorm``
as Reshape, InstanceNormalization, Reshape, Mul, Add.  PyTorch eager runs
each as one op: one dispatch, and one CUDA kernel for the first two (two for
``native_group_norm``: its statistics, then their use).  An op-by-op runtime
priced one kernel per ONNX node instead pays four extra launches and reads
and writes the whole tensor four more times (KernelBench's level-1 GELU:
predicted 5.6x its measured time, geomean of its 16 eager rows, before this).

``groups`` finds these exported shapes in a model and names, for each node
of one, the op it came from; ``ilp.baselines.unfused`` then runs each op's
nodes as PyTorch would, in the fewest kernels that can.  A shape is matched
only where its inner values are read by nothing else (PyTorch computed no
such value by itself) and its constants are the exporter's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx
from onnx import numpy_helper

from orchestrate.decompose import node_label


class _Model:
    """A model's nodes, each value's producer and readers, and its constants of one element."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.nodes = list(g.node)
        self.labels = {id(n): node_label(n, i) for i, n in enumerate(self.nodes)}
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.nodes:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in g.output}
        # the tensors of one element only: a weight is never read into numpy here
        tensors = [(t.name, t) for t in g.initializer]
        tensors += [
            (n.output[0], n.attribute[0].t)
            for n in self.nodes
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
        ]
        self.scalars = {
            name: float(numpy_helper.to_array(t).reshape(-1)[0])
            for name, t in tensors
            if math.prod(t.dims) == 1
        }

    def only_reader(self, value: str, op: str) -> onnx.NodeProto | None:
        """The one node that reads ``value``, if it is an ``op`` and ``value`` is
        no graph output."""
        readers = self.readers.get(value, [])
        if value in self.outputs or len(readers) != 1 or readers[0].op_type != op:
            return None
        return readers[0]

    def other(self, node: onnx.NodeProto, value: str) -> str | None:
        """The input of a binary ``node`` that is not ``value``."""
        ins = list(node.input)
        if len(ins) != 2 or value not in ins:
            return None
        return ins[1] if ins[0] == value else ins[0]

    def is_scalar(self, node: onnx.NodeProto, value: str, want: float) -> bool:
        """Whether ``node``'s input other than ``value`` is the constant ``want``."""
        c = self.other(node, value)
        v = None if c is None else self.scalars.get(c)
        return v is not None and math.isclose(v, want, rel_tol=1e-6)


def _gelu(m: _Model, first: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``F.gelu`` at opset 17: x / sqrt(2) -> Erf -> + 1 -> x * . -> . * 0.5."""
    if first.op_type not in ("Div", "Mul") or len(first.input) != 2:
        return None
    x = first.input[0]
    scale = math.sqrt(2) if first.op_type == "Div" else 1 / math.sqrt(2)
    if not m.is_scalar(first, x, scale):
        return None
    erf = m.only_reader(first.output[0], "Erf")
    add = erf and m.only_reader(erf.output[0], "Add")
    if not add or not m.is_scalar(add, erf.output[0], 1.0):
        return None
    times_x = m.only_reader(add.output[0], "Mul")
    if not times_x or m.other(times_x, add.output[0]) != x:
        return None
    half = m.only_reader(times_x.output[0], "Mul")
    if not half or not m.is_scalar(half, times_x.output[0], 0.5):
        return None
    return [first, erf, add, times_x, half]


def _mish(m: _Model, first: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``F.mish`` at opset 17: x * tanh(softplus(x))."""
    if first.op_type != "Softplus":
        return None
    tanh = m.only_reader(first.output[0], "Tanh")
    times_x = tanh and m.only_reader(tanh.output[0], "Mul")
    if not times_x or m.other(times_x, tanh.output[0]) != first.input[0]:
        return None
    return [first, tanh, times_x]


def _group_norm(m: _Model, first: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``nn.GroupNorm`` at opset 17: Reshape to (N, groups, -1),
    InstanceNormalization, Reshape back to Shape(x), then * weight + bias."""
    if first.op_type != "Reshape":
        return None
    x = first.input[0]
    norm = m.only_reader(first.output[0], "InstanceNormalization")
    back = norm and m.only_reader(norm.output[0], "Reshape")
    if not back or len(back.input) != 2:
        return None
    shape = m.producer.get(back.input[1])
    if shape is None or shape.op_type != "Shape" or list(shape.input) != [x]:
        return None
    scale = m.only_reader(back.output[0], "Mul")
    shift = scale and m.only_reader(scale.output[0], "Add")
    if not shift:
        return None
    return [first, norm, shape, back, scale, shift]


# each exported shape, tried at every node as its first
SHAPES: Sequence[Callable[[_Model, onnx.NodeProto], list[onnx.NodeProto] | None]] = (
    _gelu,
    _mish,
    _group_norm,
)


def groups(model: onnx.ModelProto) -> dict[str, str]:
    """For each node (by its label, as fission names origins) of a shape
    PyTorch ran as one op, the label of that shape's first node; nodes of
    no shape are left out (each its own op).  The nodes must be named
    (``cost/measurements.model`` names each): an unnamed node's label is its
    place, which the frontend's folding of constants changes."""
    m = _Model(model)
    out: dict[str, str] = {}
    for node in m.nodes:
        if m.labels[id(node)] in out:
            continue
        for shape in SHAPES:
            found = shape(m, node)
            if found and not any(m.labels[id(n)] in out for n in found):
                head = m.labels[id(found[0])]
                out.update((m.labels[id(n)], head) for n in found)
                break
    return out
