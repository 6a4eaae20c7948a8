"""The plan: the kernels chosen for a graph, as a frozen value until it is written.

``Plan`` is what the planner returns and what emission, the runner and
``explain`` read: the kernels in execution order (each with its template,
primitives, tensors, launch configuration, structural hash and predicted
cost), the totals, both baselines, the solver's report, the reasons for what
was not fused, and the primitive graph.  ``to_json`` writes PLAN.json;
``from_json`` reads one back and refuses another format.

``Planned`` pairs a plan with the kernel specs it was made from (emission
prints those); a plan read back from a file is matched again to get them
(``orchestrate.templates.match``, checked against the recorded hashes).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from orchestrate.errors import InputError, check_format
from orchestrate.ir import Attrs, Graph, Node
from orchestrate.kernels.spec import VIEW, KernelSpec, LaunchConfig

PLAN_FORMAT = "orchestrate-plan/5"
# what each earlier format lacks, for the message that refuses it
_OLDER = {
    "orchestrate-plan/1": "launch configurations per kernel",
    "orchestrate-plan/2": "the primitives' attributes, from which a bundle's kernels are regenerated",
    "orchestrate-plan/3": "the precision it was planned at (--dtype)",
    "orchestrate-plan/4": "library kernels and which backends ran its matmuls (--gemm-backends)",
}


def kernel_name(index: int, template: str) -> str:
    return f"k{index:03d}_{template}"


@dataclass(frozen=True)
class PlannedKernel:
    name: str
    template: str
    primitives: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]  # what it writes: its sinks and the optional outputs chosen
    anchor: str | None
    bytes: int
    flops: int
    predicted_us: float
    bound: str  # memory, compute, launch or view
    partition: int
    hash: str
    config: LaunchConfig

    @property
    def is_view(self) -> bool:
        return self.template == VIEW


@dataclass(frozen=True)
class Totals:
    """A plan's or a baseline's totals."""

    kernels: int
    bytes: int
    predicted_us: float


@dataclass(frozen=True)
class Summary:
    kernels: int
    views: int
    bytes: int
    flops: int
    predicted_us: float
    materialized_bytes: int  # intermediate tensors written (what --memory-budget bounds)


@dataclass(frozen=True)
class Solver:
    status: str  # optimal when proven
    gap: float
    seconds: float
    partitions: int
    unique_partitions: int
    candidates: int
    examined: int
    rejected: int
    pruned: int
    truncated_partitions: int
    solves: int
    # kernels merged across the cuts made for size (ilp.stitch), and the
    # predicted time that saved; optional in the file
    stitched: int = 0
    stitched_us: float = 0.0


@dataclass(frozen=True)
class Unfused:
    """Why a producer kernel and its consumer are not one kernel."""

    producer: str
    consumer: str
    tensor: str
    reason: str


@dataclass(frozen=True)
class Declined:
    """A pattern rule that matched the graph but refused the set it proposed."""

    rule: str
    at: str  # the node the pattern ends at
    reason: str


@dataclass(frozen=True)
class RuleUse:
    """A pattern rule whose kernels the plan runs, and what it was worth: the
    predicted time of the partitions where it fired, as planned and as
    planned without the rule's candidates (``ilp/alternatives.py``)."""

    rule: str
    kernels: tuple[str, ...]  # the planned kernels it made
    with_us: float
    without_us: float


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Primitive:
    name: str
    op: str
    inputs: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    origin: str
    attrs: Attrs


@dataclass(frozen=True)
class GraphInfo:
    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[str, ...]
    constants: tuple[str, ...]


@dataclass(frozen=True)
class Options:
    memory_budget: int | None
    time_limit: float | None
    tf32: bool
    recompute: bool
    max_kernel_nodes: int
    dtype: str | None  # --dtype: fp32, fp16 or bf16; None: the model's own precision
    gemm_backends: tuple[str, ...]  # --gemm-backends: triton, library or both
    rewrites: bool  # pattern rules on (--no-rewrites: off)
    cost: str = "analytic"  # --cost: analytic, or the learned model and its data's hash


@dataclass(frozen=True)
class Tuning:
    """How ``--tune`` priced the plan (absent from a plan made without it):
    seconds spent, distinct specs timed, configurations per spec,
    configurations timed now, found in the measurement cache and failed,
    specs the timer cannot time (a library call, say), what they were
    measured on, and the scales applied to the specs not timed
    (``cost/measured.py``).  ``fake``: figures from a stand-in timer, not
    measurements."""

    seconds: float
    specs: int
    configs: int
    measured: int
    cached: int
    failed: int
    skipped: int
    gpu: str
    driver: str
    triton: str
    fake: bool
    scales: Mapping[str, float]  # template -> measured / predicted (geometric mean)
    overall: float  # the scale of a template with no measured spec


@dataclass(frozen=True)
class Plan:
    device: str
    options: Options
    graph: GraphInfo
    kernels: tuple[PlannedKernel, ...]
    summary: Summary
    baselines: Mapping[str, Totals]  # unfused, greedy
    solver: Solver
    rejected: tuple[Unfused, ...]
    declined: tuple[Declined, ...]
    primitives: tuple[Primitive, ...]
    rules: tuple[RuleUse, ...]  # pattern rules that fired
    tuning: Tuning | None = None  # optional in the file: only a tuned plan has it

    @property
    def types(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """(shape, dtype) of every graph input and primitive."""
        out = {i.name: (i.shape, i.dtype) for i in self.graph.inputs}
        out.update({p.name: (p.shape, p.dtype) for p in self.primitives})
        return out

    def to_json(self) -> dict[str, Any]:
        data = _plain(self)
        data["graph"]["input_types"] = data["graph"].pop("inputs")
        data["graph"]["inputs"] = [i.name for i in self.graph.inputs]
        data["baselines"] = {k: _plain(v) for k, v in self.baselines.items()}
        for k, entry in zip(self.kernels, data["kernels"]):
            entry["config"] = k.config.to_json()
        if self.tuning is None:
            del data["tuning"]
        return {"format": PLAN_FORMAT, **data}

    @staticmethod
    def from_json(
        data: Mapping[str, Any], templates: Collection[str], source: str = "plan"
    ) -> Plan:
        """The plan ``data`` holds, checked (an InputError naming ``source``
        says what is wrong); its kernels may name only ``templates`` (the
        registry's, ``orchestrate.templates.NAMES``)."""
        fmt = data.get("format") if isinstance(data, Mapping) else None
        check_format(fmt, PLAN_FORMAT, _OLDER, source, "plan", "plan or optimize the model again")
        try:
            return _plan(data, templates)
        except _Malformed as e:
            raise InputError(f"{source}: malformed plan: {e}") from None


@dataclass(frozen=True)
class Planned:
    """A plan and the specs of its kernels, in the same order."""

    plan: Plan
    specs: tuple[KernelSpec, ...]


def graph_info(graph: Graph) -> GraphInfo:
    return GraphInfo(
        graph.name,
        tuple(TensorInfo(i.name, i.type.shape, i.type.dtype) for i in graph.inputs),
        tuple(graph.outputs),
        tuple(sorted(graph.constants)),
    )


def primitive(n: Node) -> Primitive:
    return Primitive(n.name, n.op.value, n.inputs, n.shape, n.dtype, n.origin, n.attrs)


def materialized(graph: Graph, written: Sequence[tuple[str, Sequence[str]]]) -> int:
    """Bytes of the intermediate tensors that (template, tensors written)
    pairs put in memory: what --memory-budget bounds (a view writes nothing)."""
    tensors = {t for template, ts in written if template != VIEW for t in ts}
    return sum(graph.types[t].nbytes for t in tensors if t not in graph.outputs)


# -- JSON ---------------------------------------------------------------------------


def _plain(value) -> Any:
    """A dataclass as JSON-able dicts and lists."""
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value) if f.name != "config"}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Malformed(Exception):
    """A field of a plan file that is missing or of the wrong type."""


def _plan(d: Mapping[str, Any], templates: Collection[str]) -> Plan:
    """The Plan in a JSON object, every field checked against the type the
    dataclasses declare (so a file cannot put a list where a number goes)."""
    d = dict(_expect(d, Mapping, "the plan"))
    g = dict(_expect(d.get("graph"), Mapping, "graph"))
    g["inputs"] = g.pop("input_types", None)  # the JSON lists names under "inputs"
    d["graph"] = g
    plan = _read(Plan, d, "plan")
    _check_names(plan, templates)
    return plan


def _check_names(plan: Plan, templates: Collection[str]) -> None:
    """Every name a plan uses is one it defines (so explain and the runner
    can look each up): primitives once each, kernels over primitives, their
    tensors among the inputs, constants and primitives."""
    prims: set[str] = set()
    for p in plan.primitives:
        if p.name in prims:
            raise _Malformed(f"primitives: {p.name!r} is listed twice")
        prims.add(p.name)
    tensors = prims | set(plan.graph.constants) | {i.name for i in plan.graph.inputs}
    for p in plan.primitives:
        _known(p.inputs, tensors, f"primitive {p.name!r} reads")
    _known(plan.graph.outputs, tensors, "graph.outputs")
    for k in plan.kernels:
        if k.template not in templates:
            raise _Malformed(f"kernel {k.name!r}: unknown template {k.template!r}")
        _known(k.primitives, prims, f"kernel {k.name!r} runs")
        _known(k.outputs, prims, f"kernel {k.name!r} writes")
        _known(k.inputs, tensors, f"kernel {k.name!r} reads")
        if k.anchor is not None:
            _known((k.anchor,), set(k.primitives), f"kernel {k.name!r} anchor")


def _known(names, known: set[str], where: str) -> None:
    unknown = next((n for n in names if n not in known), None)
    if unknown is not None:
        raise _Malformed(f"{where} {unknown!r}, which the plan does not define")


def _read(cls, data, where: str):
    hints = get_type_hints(cls)
    data = _expect(data, Mapping, where)
    unknown = sorted(set(data) - set(hints) - ({"format"} if cls is Plan else set()))
    if unknown:
        raise _Malformed(f"{where}: unknown field {unknown[0]!r}")
    values = {}
    optional = {f.name for f in fields(cls) if f.default is not MISSING}
    for name, tp in hints.items():
        if name not in data and name in optional:
            continue
        if name not in data:
            raise _Malformed(f"{where}: missing field {name!r}")
        at = f"{where}.{name}"
        if tp is LaunchConfig:
            values[name] = _config(data[name], at)
        else:
            values[name] = _value(tp, data[name], at)
    return cls(**values)


def _value(tp, v, where: str):
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, v, where)
    if hasattr(tp, "__dataclass_fields__"):
        return _read(tp, v, where)
    if tp is Attrs:
        return Attrs({k: _attr(x, f"{where}.{k}") for k, x in _object(v, where).items()})
    if tp is bool:
        return _expect(v, bool, where)
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Malformed(f"{where}: expected an integer, found {_kind(v)}")
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Malformed(f"{where}: expected a number, found {_kind(v)}")
        return float(v)
    if tp is str:
        return _expect(v, str, where)
    if origin is tuple:
        return tuple(_value(args[0], x, f"{where}[{i}]") for i, x in enumerate(_list(v, where)))
    if origin in (Mapping, dict):
        return {k: _value(args[1], x, f"{where}.{k}") for k, x in _object(v, where).items()}
    raise TypeError(f"no JSON reader for {tp!r}")  # a bug here, not in the file


def _attr(v, where: str):
    """An attribute value: a number, string, bool or (nested) list of them."""
    if isinstance(v, list):
        return tuple(_attr(x, f"{where}[{i}]") for i, x in enumerate(v))
    if v is None or not isinstance(v, (bool, int, float, str)):
        raise _Malformed(f"{where}: expected an attribute value, found {_kind(v)}")
    return v


def _config(v, where: str) -> LaunchConfig:
    data = _object(v, where)
    interpret = data.get("interpret", {})
    for k, x in {
        **{k: x for k, x in data.items() if k != "interpret"},
        **_object(interpret, f"{where}.interpret"),
    }.items():
        if k != "precision" and (isinstance(x, bool) or not isinstance(x, int) or x <= 0):
            raise _Malformed(f"{where}.{k}: expected a positive integer, found {x!r}")
    if data.get("precision", "ieee") not in ("ieee", "tf32"):
        raise _Malformed(f"{where}.precision: expected 'ieee' or 'tf32'")
    return LaunchConfig.from_json(data)


def _object(v, where: str) -> dict[str, Any]:
    return dict(_expect(v, Mapping, where))


def _list(v, where: str) -> list:
    return _expect(v, list, where)


def _expect(v, kind, where: str):
    if isinstance(v, bool) and kind is not bool or not isinstance(v, kind):
        raise _Malformed(f"{where}: expected {_KINDS[kind]}, found {_kind(v)}")
    return v


_KINDS = {Mapping: "an object", list: "a list", str: "a string", bool: "true or false"}


def _kind(v) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: v, type(None): "null"}
    return str(names.get(type(v), repr(v)[:40]))
