"""Index bounds, as onnxruntime checks them: where each gather's index is checked.

ONNX's Gather, GatherElements and GatherND refuse an index outside
``[-n, n)`` (onnxruntime: "indices element out of data bounds"); OneHot does
not (an index out of range gives a row of off values, computed by an
equality, so nothing is read).  Fission makes every ONNX index the index of
a GATHER primitive (GatherElements and GatherND first gather the coordinate
from a constant ``arange(n)``, which wraps a negative index and checks it
against its own axis), so checking GATHER indices checks them all.  Each
GATHER's index is checked in one place, by where its values come from:

* a constant, through index-preserving primitives: at fission, which refuses
  the model naming the node (and by the runner once, when it loads a
  bundle's weights);
* a graph input, through index-preserving primitives: by the runner, on the
  host, before anything is launched (a min and a max of the input array);
* anything computed in the graph: on the device.  The kernel that evaluates
  the gather stores a code into an int32 flag (``INDEX_ERROR``, a buffer the
  runner binds) where an index is out of range; the runner reads it after
  the run.  Which gathers a kernel checks is part of its spec
  (``KernelSpec.checks``, from :func:`device_checked`).

Wherever it is checked, a kernel clamps every gather index into ``[0, n)``,
so no index reads outside its tensor, whatever reaches it.

Index-preserving: IDENTITY, RESHAPE, EXPAND and TRANSPOSE (every value of
the input reaches the gather, unchanged) and integer CASTs that widen.
Anything else (a SLICE, which drops values the gather never sees; a
narrowing CAST, which changes them) makes the index computed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate import ir
from orchestrate.errors import InputError
from orchestrate.ir import Graph, Op

# The name under which a kernels module's KERNELS table binds the index error
# flag: the runner passes each kernel that checks indices its own int32 slot.
# Fission refuses a model with a tensor of this name.
INDEX_ERROR = "<index error flag>"

_SAME_VALUES = frozenset({Op.IDENTITY, Op.RESHAPE, Op.EXPAND, Op.TRANSPOSE})


@dataclass(frozen=True)
class IndexBound:
    """A GATHER primitive's valid indices, ``[-size, size)``, and where they
    are checked: ``source`` is the graph input or constant its index is
    (through index-preserving primitives), None for an index computed in the
    graph (checked on the device).  ``origin`` is the ONNX node."""

    gather: str
    size: int
    source: str | None
    origin: str


def index_bounds(graph: Graph) -> tuple[IndexBound, ...]:
    """One IndexBound per GATHER of ``graph``, in graph order."""
    out = []
    for n in graph.nodes:
        if n.op is Op.GATHER:
            size = graph.types[n.inputs[0]].shape[n.attrs["axis"]]
            out.append(IndexBound(n.name, size, index_source(graph, n.inputs[1]), n.origin))
    return tuple(out)


def index_source(graph: Graph, tensor: str) -> str | None:
    """The graph input or constant whose values ``tensor`` has, through
    index-preserving primitives; None when they are computed."""
    inputs = {i.name for i in graph.inputs}
    while True:
        if tensor in inputs or tensor in graph.constants:
            return tensor
        n = graph.producer.get(tensor)
        if n is None or not _preserves_values(graph, n):
            return None
        tensor = n.inputs[0]


def _preserves_values(graph: Graph, n: ir.Node) -> bool:
    if n.type.size == 0:  # nothing reaches the gather: no input value is its index
        return False
    if n.op in _SAME_VALUES:
        return True
    if n.op is Op.CAST:
        src = graph.types[n.inputs[0]].dtype
        return src in ir.INTS and np.can_cast(src, n.attrs["to"], casting="safe")
    return False


def device_checked(graph: Graph, nodes: Iterable[str]) -> tuple[str, ...]:
    """The gathers among ``nodes`` whose index is computed in the graph, in
    the order given: the kernel running ``nodes`` checks them on the device,
    storing ``k + 1`` into its flag where the k-th is out of range."""
    out = []
    for name in nodes:
        n = graph.producer[name]
        if n.op is Op.GATHER and index_source(graph, n.inputs[1]) is None:
            out.append(name)
    return tuple(out)


def by_gather(bounds: Iterable[IndexBound]) -> dict[str, IndexBound]:
    return {b.gather: b for b in bounds}


def out_of_range(values: np.ndarray, size: int) -> int | None:
    """A value of ``values`` outside ``[-size, size)``, or None: one min and
    one max over the array."""
    if values.size == 0:
        return None
    lo, hi = int(values.min()), int(values.max())
    return lo if lo < -size else hi if hi >= size else None


def check_values(bound: IndexBound, what: str, values: np.ndarray) -> None:
    """InputError naming ``what`` (``input 'ids'``) when ``values`` are not all
    valid indices for ``bound``."""
    bad = out_of_range(values, bound.size)
    if bad is not None:
        n = bound.size
        raise InputError(
            f"{what}: index {bad} out of range [{-n}, {n}) for gather node {bound.origin!r}"
        )


def check_constants(graph: Graph, source: str) -> None:
    """Fission's check: every constant gather index is in range (InputError
    naming the ONNX node of the first that is not)."""
    for b in index_bounds(graph):
        if b.source in graph.constants:
            check_values(b, f"{source}: constant {b.source!r}", graph.constants[b.source])


def device_error(bound: IndexBound) -> InputError:
    """The error a device-side flag reports."""
    n = bound.size
    where = f"gather node {bound.origin!r}"
    return InputError(f"{where}: an index computed in the model is out of range [{-n}, {n})")


def host_checked_inputs(
    bounds: Sequence[IndexBound], inputs: Iterable[str]
) -> dict[str, tuple[IndexBound, ...]]:
    """For each graph input that indexes a gather: the bounds it must keep."""
    names = set(inputs)
    out: dict[str, list[IndexBound]] = {}
    for b in bounds:
        if b.source in names:
            out.setdefault(b.source, []).append(b)
    return {k: tuple(v) for k, v in out.items()}
