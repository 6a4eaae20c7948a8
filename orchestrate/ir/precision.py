"""Run a float32 model in half precision (``--dtype fp16`` or ``bf16``), as autocast does.

``lower_precision(graph, "fp16")`` is a pure function from the primitive graph
to another primitive graph, applied after fission and before planning.  Every
float32 primitive gets a precision, half (fp16, or bf16 for ``"bf16"``) or
fp32, by three rules (below, "fp16" stands for either half):

* matmul and conv run on fp16 operands (a CAST to fp16 where an operand is
  fp32); their kernels accumulate in fp32 (``tl.dot``, and the reference's
  ``_matmul`` / ``_conv``), as the fp16 and bf16 tensor cores do;
* sums and products (``SUM``, ``PROD``: means, variances, softmax
  denominators) are computed in fp32, and so is the chain of elementwise
  nodes and row maxima whose every reader is fp32: a softmax or a
  normalisation is upcast once, at its input (autocast's ``x.float()``), so
  the attention rule still sees one softmax;
* any other primitive follows its inputs: fp32 if one of them is fp32 (the
  half operand is upcast, as type promotion does), fp16 otherwise.

So a LayerNorm's statistics, its output and the residual stream after it are
fp32, as under ``torch.autocast``; a GELU, a ReLU, a bias add after a matmul,
a pre-LN residual stream and every weight read by a matmul are fp16.  A
primitive the IR defines for fp32 only (``ISINF``) stays fp32.

Constants: a float32 constant is stored in fp16 when some reader wants fp16;
a reader that wants the other dtype gets a converted copy (from the float32
values: an fp32 reader such as a LayerNorm epsilon loses nothing).  A
constant beyond the half's range (|x| > 65504 for fp16; bf16 has fp32's
exponent range) stays fp32 and its readers compute in fp32; one that a matmul
or conv reads is an error naming it.  Graph inputs and outputs keep their
dtypes: inputs are cast where read (a slice or gather of an input after it
selects), outputs cast back, under their own names.
The casts are primitives, so they fuse into the kernels next to them (the
kernels compute half values in fp32 registers and round where they store, so
a cast inside a kernel is free).  A model that already holds the other half
(float16 tensors under ``bf16``, or the reverse) is refused: one graph never
mixes the two.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import ml_dtypes
import numpy as np

from orchestrate import ir
from orchestrate.errors import InputError
from orchestrate.ir import Attrs, Graph, Node, Op, TensorType, type_rules

# --dtype values and the IR dtypes they name
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SUPPORTED = ("fp32", "fp16", "bf16")

# Default verification tolerance per --dtype (verify.py's rtol: errors judged
# against rtol x the output's largest magnitude).  fp16 keeps 11 significant
# bits (unit roundoff 2**-11 = 4.9e-4); a few roundings of fp16 activations
# through a few layers, with fp32 accumulation, stay within 1e-2 of the
# output's scale.  bf16 keeps 8 (unit roundoff 2**-8 = 3.9e-3, 8x fp16's):
# its errors measure about 7x fp16's, at most 1.2e-2 over the examples, and
# 4e-2 keeps 3x of room over that while a wrong kernel still fails (README,
# "Half precision", gives the errors measured for both).
RTOL = {"fp16": 1e-2, "bf16": 4e-2}

_ALWAYS_HALF = frozenset({Op.MATMUL, Op.CONV})
_ALWAYS_FULL = frozenset({Op.SUM, Op.PROD, Op.CUMSUM})
# what an fp32 reader pulls to fp32 with it (upcasting the chain at its start)
_UPCAST_WITH_READERS = ir.ELEMENTWISE | {Op.RMAX, Op.RMIN}
_SELECTIONS = frozenset({Op.SLICE, Op.GATHER})


class PrecisionError(InputError):
    """A ``dtype`` the model cannot run at.  ``field``, ``value`` and
    ``problem`` let the CLI name its flag (as ``PlanOptionError`` does)."""

    def __init__(self, value, problem: str, source: str = ""):
        where = f"{source}: " if source else ""
        super().__init__(f"{where}dtype={value!r}: {problem}")
        self.field, self.value, self.problem, self.source = "dtype", value, problem, source


def check_dtype(value, name: str = "dtype") -> str | None:
    """``value`` as a --dtype (None: the model's own); InputError naming
    ``name`` (``dtype``, or the CLI's ``--dtype``) otherwise."""
    if value is None or value in SUPPORTED:
        return value
    where = f"{name} {value}" if name.startswith("--") else f"{name}={value!r}"
    raise InputError(f"{where}: {unsupported(value)}")


def model_dtype(graph: Graph) -> str | None:
    """The model's own float dtype: float32 if any tensor is float32, else
    the widest float it has (None for a model without floats)."""
    found = {t.dtype for t in graph.types.values()}
    for dtype in ("float32", "float64", *ir.HALF):
        if dtype in found:
            return dtype
    return None


def lower_precision(graph: Graph, dtype: str | None, source: str = "model") -> Graph:
    """``graph`` run at ``dtype`` (``fp32``, ``fp16``, ``bf16``, or None: the
    model's own).  PrecisionError (naming ``source``) for a dtype the model
    cannot run at."""
    if dtype is None:
        return graph
    if dtype not in SUPPORTED:
        raise PrecisionError(dtype, unsupported(dtype), source)
    own = model_dtype(graph)
    if dtype == "fp32":
        if own in ir.HALF:
            raise PrecisionError(
                dtype,
                f"the model computes in {own}; orchestrate lowers precision, it does not raise it",
                source,
            )
        return graph
    found = {t.dtype for t in graph.types.values()}
    other = next((h for h in ir.HALF if h in found and h != DTYPES[dtype]), None)
    if other is not None:
        raise PrecisionError(
            dtype,
            f"the model computes in {other}; orchestrate lowers float32 "
            "to one half precision, it does not mix two",
            source,
        )
    if own is None or "float32" not in found:
        return graph  # nothing in float32 to lower
    return _Lowering(graph, dtype, source).graph()


def unsupported(dtype) -> str:
    return "expected fp16, bf16 or fp32 (the default is the model's own precision)"


class _Lowering:
    def __init__(self, graph: Graph, dtype: str, source: str):
        self.g, self.dtype, self.half, self.source = graph, dtype, DTYPES[dtype], source
        self.overflow = {k for k, v in graph.constants.items() if _overflows(v, self.half)}
        self.full = self._full_precision()
        self.inputs = {i.name for i in graph.inputs}

    # -- which primitives compute in fp32 -------------------------------------------

    def _lowerable(self, n: Node) -> bool:
        types = self.g.types
        return n.dtype == "float32" or any(types[i].dtype == "float32" for i in n.inputs)

    def _full_precision(self) -> set[str]:
        """Names of the lowerable primitives that compute in fp32 (a fixpoint
        of the three rules in the module docstring; the rest compute in half)."""
        g = self.g
        nodes = [n for n in g.nodes if self._lowerable(n)]
        full: set[str] = set()
        for n in nodes:
            decider = g.types[n.inputs[1] if n.op is Op.WHERE else n.inputs[0]].dtype
            needs_full = decider == "float32" and self.half not in ir.DTYPES[n.op]
            if n.op in _ALWAYS_HALF:
                bad = next((i for i in n.inputs if i in self.overflow), None)
                if bad is not None:
                    big = float(np.max(np.abs(g.constants[bad][np.isfinite(g.constants[bad])])))
                    most = float(ml_dtypes.finfo(self.half).max)
                    raise PrecisionError(
                        self.dtype,
                        f"weight {bad!r} read by {n.op.value} {n.name!r} holds "
                        f"{big:.4g}, beyond {self.half}'s range ({most:.6g})",
                        self.source,
                    )
            elif (
                (n.op in _ALWAYS_FULL and n.dtype == "float32")
                or needs_full
                or any(i in self.overflow for i in n.inputs)
            ):
                full.add(n.name)
        changed = True
        while changed:
            changed = False
            for n in nodes:  # follow the inputs
                if (
                    n.name not in full
                    and n.op not in _ALWAYS_HALF
                    and any(i in full for i in n.inputs)
                ):
                    full.add(n.name)
                    changed = True
            for n in reversed(nodes):  # upcast a chain whose every reader is fp32
                readers = g.consumers.get(n.name, ())
                if (
                    n.name not in full
                    and n.op in _UPCAST_WITH_READERS
                    and n.dtype == "float32"
                    and readers
                    and all(c.name in full for c in readers)
                ):
                    full.add(n.name)
                    changed = True
        return full

    def _precision(self, n: Node) -> str:
        return "float32" if n.name in self.full else self.half

    def _wanted(self, n: Node, i: int) -> str | None:
        """The dtype primitive ``n`` reads its input ``i`` in (None: as it is)."""
        t = n.inputs[i]
        if self.g.types[t].dtype != "float32" or n.op is Op.CAST:
            return None
        if (n.op is Op.WHERE and i == 0) or (n.op is Op.GATHER and i == 1):
            return None
        if n.op in _SELECTIONS and i == 0 and t in self.inputs:
            # a selection of a graph input reads it as it is and the cast
            # follows what it selected: a decode step's first rows of a cache
            # buffer, not the whole buffer cast every step
            return None
        return self._precision(n)

    # -- the new graph ------------------------------------------------------------------

    def graph(self) -> Graph:
        g = self.g
        constants = dict(g.constants)
        for name, arr in g.constants.items():
            if arr.dtype.name == "float32" and self._store_half(name):
                constants[name] = arr.astype(self.half)
        self.constants = constants
        self.copies: dict[str, str] = {}  # a constant's copy in another dtype -> the constant
        self.taken = set(g.types) | set(g.outputs)
        # tensor -> {dtype: the name holding it in that dtype}
        self.held: dict[str, dict[str, str]] = {i.name: {i.type.dtype: i.name} for i in g.inputs}
        for name, arr in constants.items():
            self.held[name] = {arr.dtype.name: name}
        self.types = {t: TensorType(g.types[t].shape, d) for t in self.held for d in self.held[t]}
        self.nodes: list[Node] = []
        outputs = set(g.outputs)
        for n in g.nodes:
            if not self._lowerable(n):
                self.nodes.append(n)
                self.held[n.name] = {n.dtype: n.name}
                self.types[n.name] = n.type
                continue
            inputs = tuple(self._read(n, k) for k in range(len(n.inputs)))
            attrs = n.attrs
            if n.op is Op.CAST and attrs["to"] == "float32":
                attrs = Attrs(attrs, to=self._precision(n))
            types = tuple(self.types[t] for t in inputs)
            out = type_rules.infer(n.op, types, attrs)
            name = n.name
            if n.name in outputs and out.dtype != n.dtype:
                name = self._fresh(f"{n.name}_{_short(out.dtype)}")
            self.nodes.append(Node(n.op, name, inputs, out, attrs, n.origin))
            self.held[n.name] = {out.dtype: name}
            self.types[name] = out
        for o in g.outputs:  # outputs cast back, under their own names
            want = g.types[o].dtype
            if o not in self.held[o].values():
                src = self.held[o][next(iter(self.held[o]))]
                origin = g.producer[o].origin if o in g.producer else ""
                self.nodes.append(
                    Node(
                        Op.CAST,
                        o,
                        (src,),
                        TensorType(g.types[o].shape, want),
                        Attrs(to=want),
                        origin,
                    )
                )
        copied = {
            field: {
                **symbolic,
                **{k: symbolic[t] for k, t in self.copies.items() if t in symbolic},
            }
            for field, symbolic in (
                ("constant_shapes", g.constant_shapes),
                ("constant_values", g.constant_values),
            )
        }
        lowered = replace(g.with_nodes(self.nodes, self.constants), **copied)
        return type_rules.validate(lowered)

    def _store_half(self, name: str) -> bool:
        """Whether constant ``name`` is stored in half: some reader wants half
        and half holds its values."""
        if name in self.overflow:
            return False
        return any(
            self._wanted(c, k) == self.half
            for c in self.g.consumers.get(name, ())
            for k, i in enumerate(c.inputs)
            if i == name
        )

    def _read(self, n: Node, k: int) -> str:
        """The name of input ``k`` of ``n`` in the dtype ``n`` reads it in (a
        CAST made once per tensor and dtype; for a constant, a converted copy
        of its float32 values)."""
        t, want = n.inputs[k], self._wanted(n, k)
        held = self.held[t]
        if want is None or want in held:
            return held[want] if want is not None else next(iter(held.values()))
        src = next(iter(held.values()))
        name = self._fresh(f"{t}_{_short(want)}")
        shape = self.g.types[t].shape
        held[want] = name
        self.types[name] = TensorType(shape, want)
        if t in self.g.constants:
            self.constants[name] = self.g.constants[t].astype(want)
            self.copies[name] = t
            return name
        origin = self.g.producer[t].origin if t in self.g.producer else n.origin
        self.nodes.append(
            Node(Op.CAST, name, (src,), TensorType(shape, want), Attrs(to=want), origin)
        )
        return name

    def _fresh(self, base: str) -> str:
        name = base
        for k in _counter():
            if name not in self.taken:
                break
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def _counter() -> Iterator[int]:
    k = 1
    while True:
        yield k
        k += 1


def _short(dtype: str) -> str:
    return {"float16": "f16", "float32": "f32", "bfloat16": "bf16"}.get(dtype, dtype)


def _overflows(arr: np.ndarray, half: str) -> bool:
    """Whether a float32 array has finite values that are infinite in ``half``."""
    if arr.dtype.name != "float32":
        return False
    with np.errstate(over="ignore"):
        return bool(np.any(np.isfinite(arr) & np.isinf(arr.astype(half))))
