"""The plan: the kernels chosen for a graph, as a frozen value until it is written.

``Plan`` is what the planner returns and what emission, the runner and
``explain`` read: the kernels in execution order (each with its template,
primitives, tensors, launch configuration, structural hash and predicted
cost), the totals, both baselines, the solver's report, the reasons for what
was not fused, and the primitive graph.  ``to_json`` writes PLAN.json;
``from_json`` reads one back and refuses another format.

``Planned`` pairs a plan with the kernel specs it was made from (emission
prints those); a plan read back from a file is matched again to get them
(``orchestrate.kernels.rules.match``, checked against the recorded hashes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from orchestrate.errors import InputError, check_format
from orchestrate.ir import Graph, Node
from orchestrate.kernels.spec import VIEW, KernelSpec, LaunchConfig

PLAN_FORMAT = "orchestrate-plan/2"
# what each earlier format lacks, for the message that refuses it
_OLDER = {"orchestrate-plan/1": "launch configurations per kernel"}


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
        return {"format": PLAN_FORMAT, **data}

    @staticmethod
    def from_json(data: Mapping[str, Any], source: str = "plan") -> Plan:
        fmt = data.get("format") if isinstance(data, Mapping) else None
        check_format(fmt, PLAN_FORMAT, _OLDER, source, "plan", "plan or optimize the model again")
        try:
            return _plan(data)
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"{source}: malformed plan ({type(e).__name__}: {e})") from None


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
    return Primitive(n.name, n.op.value, n.inputs, n.shape, n.dtype, n.origin)


def materialized(graph: Graph, written: Sequence[tuple[str, Sequence[str]]]) -> int:
    """Bytes of the intermediate tensors that (template, tensors written)
    pairs put in memory: what --memory-budget bounds (a view writes nothing)."""
    tensors = {t for template, ts in written if template != VIEW for t in ts}
    return sum(graph.types[t].nbytes for t in tensors if t not in graph.outputs)


# -- JSON ---------------------------------------------------------------------------


def _plain(value) -> Any:
    """A dataclass as JSON-able dicts and lists."""
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)
                if f.name != "config"}  # fmt: skip
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _plan(d: Mapping[str, Any]) -> Plan:
    g = d["graph"]
    kernels = tuple(
        PlannedKernel(
            k["name"],
            k["template"],
            tuple(k["primitives"]),
            tuple(k["inputs"]),
            tuple(k["outputs"]),
            k["anchor"],
            int(k["bytes"]),
            int(k["flops"]),
            float(k["predicted_us"]),
            k["bound"],
            int(k["partition"]),
            k["hash"],
            LaunchConfig.from_json(k["config"]),
        )  # fmt: skip
        for k in d["kernels"]
    )
    return Plan(
        device=d["device"],
        options=Options(**d["options"]),
        graph=GraphInfo(
            g["name"],
            tuple(TensorInfo(i["name"], tuple(i["shape"]), i["dtype"]) for i in g["input_types"]),
            tuple(g["outputs"]),
            tuple(g["constants"]),
        ),  # fmt: skip
        kernels=kernels,
        summary=Summary(**d["summary"]),
        baselines={k: Totals(**v) for k, v in d["baselines"].items()},
        solver=Solver(**d["solver"]),
        rejected=tuple(Unfused(**r) for r in d["rejected"]),
        declined=tuple(Declined(**r) for r in d["declined"]),
        primitives=tuple(
            Primitive(
                p["name"], p["op"], tuple(p["inputs"]), tuple(p["shape"]), p["dtype"], p["origin"]
            )  # fmt: skip
            for p in d["primitives"]
        ),
    )
