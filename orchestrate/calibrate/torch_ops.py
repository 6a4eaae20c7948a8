"""The ONNX nodes that PyTorch ran as one op.

A measurement row's graph is what ``torch.onnx.export`` wrote at opset 17,
and the exporter writes some single PyTorch ops as several nodes: ``F.gelu``
as Div, Erf, Add, Mul, Mul (ONNX has ``Gelu`` only from opset 20),
``F.mish`` as Softplus, Tanh, Mul (``Mish`` from opset 18), ``nn.GroupNorm``
as Reshape, InstanceNormalization, Reshape, Mul, Add,
``F.cosine_similarity`` as three Mul/ReduceSum pairs, Mul, Sqrt, Max, Div,
and ``F.kl_div`` as Log, Sub, Mul, Greater, Where (and Shape,
ConstantOfShape for its zeros) before its ReduceSum.  PyTorch eager runs
each as one op: one dispatch, and one CUDA kernel for the first two (two for
``native_group_norm``: its statistics, then their use).  An op-by-op runtime
priced one kernel per ONNX node instead pays four extra launches and reads
and writes the whole tensor four more times (KernelBench's level-1 GELU:
predicted 5.6x its measured time, geomean of its 16 eager rows, before this;
its CosineSimilarityLoss and KLDivLoss 2.5x over their 22).

Each op is priced as the fewest kernels a template runs it in, and each of
those pays eager's dispatch.  For GELU, Mish and GroupNorm that is PyTorch's
own count.  ATen's composite ``kl_div`` (an xlogy, a product, a difference,
a sum) and cosine similarity (norms, clamps, divisions, a product, a sum)
launch more, from C++ inside one dispatch; the rows say these cost less than
a dispatch each: KernelBench's eager KLDivLoss comes out within 1.25x, its
CosineSimilarityLoss at 0.50-0.76x of the measured times (11 rows each).

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

    def same_scalar(self, one: str, other: str) -> bool:
        """Whether two values are one value, or constants of one element that are equal."""
        if one == other:
            return True
        a, b = self.scalars.get(one), self.scalars.get(other)
        return a is not None and a == b

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


def _square_sum(m: _Model, x: str, axes: str) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """The Mul(x, x) -> ReduceSum over the same ``axes`` that a cosine
    similarity's norm of ``x`` is exported as."""
    for sq in m.readers.get(x, []):
        if sq.op_type == "Mul" and list(sq.input) == [x, x]:
            total = m.only_reader(sq.output[0], "ReduceSum")
            if total and len(total.input) == 2 and m.same_scalar(total.input[1], axes):
                return sq, total
    return None


def _cosine_similarity(m: _Model, first: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``F.cosine_similarity(a, b)`` at opset 17: sum(a * b) / max(sqrt(sum(a * a)
    * sum(b * b)), eps), each sum a Mul then a ReduceSum over the same axes."""
    if first.op_type != "Mul" or len(first.input) != 2 or first.input[0] == first.input[1]:
        return None
    a, b = first.input
    dot = m.only_reader(first.output[0], "ReduceSum")
    if not dot or len(dot.input) != 2:
        return None
    norms = [_square_sum(m, x, dot.input[1]) for x in (a, b)]
    if None in norms:
        return None
    (sq_a, sum_a), (sq_b, sum_b) = norms
    both = m.only_reader(sum_a.output[0], "Mul")
    if not both or sorted(both.input) != sorted([sum_a.output[0], sum_b.output[0]]):
        return None
    if m.only_reader(sum_b.output[0], "Mul") is not both:
        return None
    root = m.only_reader(both.output[0], "Sqrt")
    floor = root and m.only_reader(root.output[0], "Max")
    div = floor and m.only_reader(floor.output[0], "Div")
    if not div or list(div.input) != [dot.output[0], floor.output[0]]:
        return None
    if m.only_reader(dot.output[0], "Div") is not div:
        return None
    return [first, dot, sq_a, sum_a, sq_b, sum_b, both, root, floor, div]


def _kl_div(m: _Model, first: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``F.kl_div(x, t)`` at opset 17: where(t > 0, t * (log(t) - x), 0), then
    its ReduceSum or ReduceMean where the reduction is not ``none``."""
    if first.op_type != "Log":
        return None
    t = first.input[0]
    sub = m.only_reader(first.output[0], "Sub")
    if not sub or sub.input[0] != first.output[0]:
        return None
    times = m.only_reader(sub.output[0], "Mul")
    if not times or m.other(times, sub.output[0]) != t:
        return None
    readers = m.readers.get(times.output[0], [])
    shape = next((r for r in readers if r.op_type == "Shape"), None)
    where = next((r for r in readers if r.op_type == "Where"), None)
    if len(readers) != 2 or not shape or not where or times.output[0] in m.outputs:
        return None
    zeros = m.only_reader(shape.output[0], "ConstantOfShape")
    positive = m.producer.get(where.input[0])
    if not zeros or list(where.input[1:]) != [times.output[0], zeros.output[0]]:
        return None
    if not positive or positive.op_type != "Greater" or positive.input[0] != t:
        return None
    if not m.is_scalar(positive, t, 0.0) or m.only_reader(positive.output[0], "Where") is not where:
        return None
    found = [first, sub, times, shape, zeros, positive, where]
    reduced = [m.only_reader(where.output[0], op) for op in ("ReduceSum", "ReduceMean")]
    return found + [r for r in reduced if r is not None]


# each exported shape, tried at every node as its first
SHAPES: Sequence[Callable[[_Model, onnx.NodeProto], list[onnx.NodeProto] | None]] = (
    _gelu,
    _mish,
    _group_norm,
    _cosine_similarity,
    _kl_div,
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
