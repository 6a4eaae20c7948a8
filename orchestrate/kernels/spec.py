"""The kernel spec: the one description of a kernel, and the refusal of one.

A rule (``templates/__init__.py``) looks at a set of primitives and returns either
a :class:`KernelSpec` (this set runs as one kernel, and here is everything
about it) or a :class:`Rejection` (it cannot, and why).  Everything
downstream reads the spec and never re-derives it:

* cost prices it (bytes, flops, the launch configuration's tiles);
* the linear program chooses among specs;
* emission prints one ``@triton.jit`` function per distinct spec;
* the runner launches it.

A spec names its primitives and tensors, the roles they play in the template
(``roles``: anchor, prologue and epilogue; row space and phases; the
attention roles) and the launch configuration chosen for the device
(``config``).  Its ``hash`` is structural: two specs with equal hashes
generate the same source, whatever their tensors are called (a transformer's
layers), so each is costed once and compiled once.

Neither result type has a truth value: ``if rule(...)`` raises TypeError.
Test ``isinstance(result, Rejection)``.  (A refusal that read as False once
switched the on-chip fit check off without anyone noticing.)
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from orchestrate.ir import Graph

VIEW = "view"
POINTWISE = "pointwise"
ROW_REDUCE = "row_reduce"
MATMUL = "matmul"
CONV = "conv"
WINDOW = "window"
ATTENTION = "attention"
NORM_MATMUL = "norm_matmul"  # a norm moved past the matmul it feeds (templates/norm_matmul/rule.py)
MERGED_MATMUL = "merged_matmul"  # sibling matmuls reading one activation, one launch
NORM_MERGED_MATMUL = "norm_merged_matmul"  # a norm moved past merged siblings (norm_siblings.py)
# library kernels: a call into torch (cuBLAS, cuDNN, SDPA) in place of generated Triton
LIBRARY_MATMUL = "library_matmul"
LIBRARY_CONV = "library_conv"
LIBRARY_ATTENTION = "library_attention"
LIBRARY = (LIBRARY_MATMUL, LIBRARY_CONV, LIBRARY_ATTENTION)
# which kernels may run matmuls, convolutions and attention (--gemm-backends):
# generated Triton, library calls, or both competing in the linear program
GEMM_BACKENDS = ("triton", "library")


class _NoTruth:
    def __bool__(self) -> bool:
        raise TypeError(
            f"a {type(self).__name__} has no truth value: test isinstance(result, Rejection)"
        )


@dataclass(frozen=True)
class Rejection(_NoTruth):
    """Why a set of primitives is not one kernel."""

    reason: str


@dataclass(frozen=True)
class Target:
    """What the rules need to know besides the graph: the device, whether
    fp32 matmuls may use TF32 tensor cores (``--tf32``), and how to order the
    launch configurations that fit (``rank``: lower is better, ties go to the
    template's own order).  The planner ranks by the cost model's predicted
    time; loading a bundle ranks its recorded configuration first.  Without a
    rank the first configuration that fits is taken.  ``gemm_backends``: who
    may run matmul, conv and attention sets (``GEMM_BACKENDS``); Triton runs
    every other set whatever it says.  ``rewrites``: whether the pattern
    rules (attention, merged siblings, ...) propose their sets at all
    (``--no-rewrites`` turns them off)."""

    device: Any  # orchestrate.cost.devices.Device
    tf32: bool = False
    rank: Callable[[Graph, KernelSpec], float] | None = None
    gemm_backends: tuple[str, ...] = GEMM_BACKENDS
    rewrites: bool = True
    # (template, launch configuration) that template's rule must take, checked
    # to fit and to cover the shape (``kernels/rule.ranked``): a dynamic
    # bundle's kernels, matched again at another binding of its dimensions,
    # keep the plan's configuration
    # (the third item: whether its interpreter blocks are the rules' own at
    # this shape, or exactly the recorded ones, even none)
    pin: tuple[str, LaunchConfig, bool] | None = None
    # a check every kernel must also pass: the kernel to use (the same, or
    # with blocks widened) or the Rejection saying why not.  A dynamic plan
    # admits only kernels legal at every binding of its range
    # (``plan/admit.py``); ``templates.match`` applies it
    admit: Callable[[Graph, KernelSpec], KernelSpec | Rejection] | None = None


# -- launch configuration --------------------------------------------------------


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel is launched: its ``tl.constexpr`` block sizes on the GPU,
    ``num_warps`` and ``num_stages`` (software-pipelining depth), the block
    sizes under Triton's interpreter (whose cost grows with the number of
    programs, not with block size), and, for matmul and conv, the fp32
    ``tl.dot`` precision (``ieee`` or ``tf32``)."""

    blocks: tuple[tuple[str, int], ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    interpret: tuple[tuple[str, int], ...] = ()
    precision: str = "ieee"

    def __getitem__(self, name: str) -> int:
        return dict(self.blocks)[name]

    def to_json(self) -> dict:
        out: dict[str, Any] = dict(self.blocks)
        out["num_warps"] = self.num_warps
        out["num_stages"] = self.num_stages
        if self.precision != "ieee":
            out["precision"] = self.precision
        if self.interpret:
            out["interpret"] = dict(self.interpret)
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> LaunchConfig:
        special = {"num_warps", "num_stages", "precision", "interpret"}
        return LaunchConfig(
            blocks=tuple((k, int(v)) for k, v in data.items() if k not in special),
            num_warps=int(data.get("num_warps", 4)),
            num_stages=int(data.get("num_stages", 3)),
            interpret=tuple((k, int(v)) for k, v in data.get("interpret", {}).items()),
            precision=str(data.get("precision", "ieee")),
        )


def split_k(config: LaunchConfig) -> int:
    """How many programs share each output tile's K loop (``SPLIT_K``; 1
    when the configuration does not split K)."""
    return dict(config.blocks).get("SPLIT_K", 1)


# The names under which a kernels module's KERNELS table binds the scratch a
# split-K matmul needs (``templates/matmul/emit.py``): an fp32 workspace of SPLIT_K
# partial tiles per output element, and one int32 arrival counter per output
# tile, zero between launches (the last program of a tile resets it).  The
# runner allocates one of each, as large as the largest kernel's, and binds
# it to every split-K kernel (kernels run one after another).
SPLIT_K_PARTIALS = "<split-k partials>"
SPLIT_K_COUNTERS = "<split-k counters>"
SCRATCH_DTYPES = {SPLIT_K_PARTIALS: "float32", SPLIT_K_COUNTERS: "int32"}


def split_k_scratch(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(workspace elements, counters) a split-K matmul or conv needs: SPLIT_K
    x the output's elements, and one counter per output tile under the GPU's
    or the interpreter's block sizes, whichever has more tiles.  (0, 0)
    unsplit.  A template that splits otherwise says so (``Template.scratch``)."""
    s = split_k(spec.config)
    if s == 1:
        return 0, 0
    *batch, m, n = graph.producer[spec.anchor].shape
    b = 1
    for d in batch:
        b *= d
    tiles = 0
    for blocks in (
        dict(spec.config.blocks),
        {**dict(spec.config.blocks), **dict(spec.config.interpret)},
    ):
        bm, bn = blocks["BLOCK_M"], blocks["BLOCK_N"]
        tiles = max(tiles, -(-m // bm) * -(-n // bn))
    return s * b * m * n, b * tiles


def launch_config(
    blocks: Mapping[str, int], interpret: Mapping[str, int] | None = None, **options
) -> LaunchConfig:
    """A LaunchConfig from dicts (interpreter block sizes equal to the GPU's
    are left out)."""
    fast = {k: v for k, v in (interpret or {}).items() if blocks.get(k) != v}
    return LaunchConfig(tuple(blocks.items()), interpret=tuple(fast.items()), **options)


# -- roles --------------------------------------------------------------------------


class Operand(enum.Enum):
    """What an attention prologue node computes (how often it is evaluated)."""

    Q = "q"  # part of Q only: once per query row
    KV = "kv"  # part of K or V: once per block of query rows
    SCORES = "scores"  # a side input of the score chain: once per score


class _Roles:
    """What roles add to a spec's structural hash beyond its nodes' wiring:
    nothing, unless they record more (which columns a sibling takes, a
    folded branch's parts); ``local`` numbers the spec's nodes, ``ext`` its
    inputs."""

    def structure(self, local: Mapping[str, int], ext: Mapping[str, int]) -> str | None:
        return None


@dataclass(frozen=True)
class Elementwise(_Roles):
    """Pointwise and view kernels: every node is evaluated per output element."""


@dataclass(frozen=True)
class Rows(_Roles):
    """A row-reduce kernel.  The reduced input X (shape ``x``) is a matrix of
    ``rows`` rows of ``length`` columns (the ``axes`` reduced).  Nodes in
    ``row_space`` hold one value per row (the reductions and what is computed
    from row values only); the others are per element of X.  ``depth`` is
    the number of dependent reductions behind each node; reductions of the
    same depth form one phase.  ``looped``: rows too long for registers are
    reduced in a loop over column blocks, one pass per phase."""

    x: tuple[int, ...]
    axes: tuple[int, ...]
    rows: int
    length: int
    reductions: tuple[str, ...]
    row_space: frozenset[str]
    depth: tuple[tuple[str, int], ...]
    phases: int
    looped: bool

    def depth_of(self, name: str) -> int:
        return dict(self.depth)[name]

    @property
    def keep(self) -> tuple[int, ...]:
        return tuple(1 if i in self.axes else d for i, d in enumerate(self.x))

    @property
    def cols_shape(self) -> tuple[int, ...]:
        return tuple(self.x[a] for a in self.axes)


@dataclass(frozen=True)
class Anchored(_Roles):
    """A matmul, conv or window kernel: the anchor, the nodes evaluated on its
    operand tiles before it (``prologue``) and on its result after it
    (``epilogue``, element-aligned with the anchor), both in graph order."""

    anchor: str
    prologue: tuple[str, ...]
    epilogue: tuple[str, ...]


@dataclass(frozen=True)
class Segment:
    """One sibling of a merged matmul: its matmul ``anchor``, its constant
    ``weight`` [K, N], the columns [start, stop) that weight occupies in the
    siblings' weights concatenated along N, and its own ``epilogue``
    (elementwise nodes on its result, graph order)."""

    anchor: str
    weight: str
    start: int
    stop: int
    epilogue: tuple[str, ...] = ()


@dataclass(frozen=True)
class Siblings(_Roles):
    """A merged matmul (``templates/merged_matmul/rule.py``): ``activation`` @ the
    segments' weights concatenated along N, one launch, each segment's
    column range through its own epilogue into its own tensors."""

    activation: str
    segments: tuple[Segment, ...]
    prologue: tuple[str, ...] = ()  # nodes computing the activation in the kernel (a norm)

    @property
    def anchor(self) -> str:
        return self.segments[0].anchor

    def segment_roles(self, g: Segment) -> Anchored:
        """Segment ``g`` as the roles of a one-matmul kernel."""
        return Anchored(g.anchor, self.prologue, g.epilogue)

    def structure(self, local: Mapping[str, int], ext: Mapping[str, int]) -> str:
        """Which columns each sibling takes, and its epilogue."""
        return "seg" + ";".join(
            f"n{local[g.anchor]}:x{ext[g.weight]}:{g.start}-{g.stop}:"
            + ",".join(str(local[e]) for e in g.epilogue)
            for g in self.segments
        )


@dataclass(frozen=True)
class AttentionRoles(_Roles):
    """A flash-attention kernel: ``softmax(chain(m1)) @ V``."""

    m1: str  # scores = Q @ K
    m2: str  # output = P @ V (the anchor, the only output)
    scores: tuple[str, ...]  # elementwise nodes from m1 to the softmax input, graph order
    x: str  # the softmax input (m1 itself when there is no score chain)
    softmax: tuple[str, ...]  # RMAX, SUB, EXP, SUM, DIV, the floors and the casts of P
    max_floor: float | None  # M = max(RMAX, c): the running max starts at c
    sum_floor: float | None  # Z = max(SUM, c)
    prologue: tuple[tuple[str, Operand], ...]  # computes Q, K, V or the score side inputs
    nan_guard: bool = False  # P = WHERE(ISNAN(P), 0, P): a row of only -inf gives 0

    @property
    def anchor(self) -> str:
        return self.m2


@dataclass(frozen=True)
class LibraryCall(_Roles):
    """A library kernel: one torch call on the anchor's operands, computing

        out = alpha * anchor + beta * bias

    (``torch.addmm`` / ``baddbmm``'s alpha and beta; a conv's bias is
    ``torch.nn.functional.conv*``'s with beta 1).  ``epilogue`` holds the
    scale and bias nodes the call absorbs, in graph order; ``bias`` is the
    tensor added (None: beta is 0)."""

    anchor: str
    epilogue: tuple[str, ...] = ()
    alpha: float = 1.0
    beta: float = 0.0
    bias: str | None = None


@dataclass(frozen=True)
class LibraryAttention(_Roles):
    """``scaled_dot_product_attention(q, k^T, v, attn_mask, scale)``: the
    scores ``m1`` = q @ k (k as the graph holds it, [.., D, Lk]), scaled by
    ``scale``, plus ``mask`` (an additive float tensor, or a boolean one
    where False means -inf), softmax, @ v in ``m2``.  ``causal``: the mask is
    a constant that hides exactly the keys after each query (top-left
    aligned), passed as SDPA's ``is_causal`` instead (its fastest kernels
    take no mask tensor)."""

    m1: str
    m2: str
    scale: float
    mask: str | None = None
    boolean_mask: bool = False
    causal: bool = False
    hides: bool = False  # the boolean mask marks the hidden keys (True: -inf), not the kept

    @property
    def anchor(self) -> str:
        return self.m2

    def structure(self, local: Mapping[str, int], ext: Mapping[str, int]) -> str | None:
        return "causal" if self.causal else None  # read from a constant


Roles = Elementwise | Rows | Anchored | Siblings | AttentionRoles | LibraryCall | LibraryAttention


# -- the spec -----------------------------------------------------------------------


@dataclass(frozen=True)
class KernelSpec(_NoTruth):
    """A legal kernel: what it runs, how, and with which tiles."""

    template: str
    nodes: tuple[str, ...]  # in graph order
    inputs: tuple[str, ...]  # tensors read from memory (graph inputs, constants, others)
    outputs: tuple[str, ...]  # sinks: always written
    optional: tuple[str, ...]  # may be written as well (the linear program decides)
    space: tuple[int, ...]  # iteration space: output shape, reduced input, scores
    roles: Roles
    config: LaunchConfig
    # gathers whose index is computed in the graph, so the kernel checks it on
    # the device: it stores k + 1 into its index error flag where the k-th of
    # them is out of range (orchestrate.ir.bounds)
    checks: tuple[str, ...] = ()
    hash: str = ""

    @property
    def anchor(self) -> str | None:
        """The matmul / conv / pool, the first reduction, or attention's P @ V."""
        r = self.roles
        if isinstance(r, Rows):
            return r.reductions[0]
        return getattr(r, "anchor", None)

    def renamed(self, mapping: Mapping[str, str]) -> KernelSpec:
        """The same kernel over renamed tensors (an identical partition)."""
        return replace(
            self,
            nodes=_rename(self.nodes, mapping),
            inputs=_rename(self.inputs, mapping),
            outputs=_rename(self.outputs, mapping),
            optional=_rename(self.optional, mapping),
            roles=_rename(self.roles, mapping),
            checks=_rename(self.checks, mapping),
        )


def _rename(value, mapping: Mapping[str, str]):
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, tuple):
        return tuple(_rename(v, mapping) for v in value)
    if isinstance(value, frozenset):
        return frozenset(_rename(v, mapping) for v in value)
    if isinstance(
        value,
        (
            Elementwise,
            Rows,
            Anchored,
            Siblings,
            Segment,
            AttentionRoles,
            LibraryCall,
            LibraryAttention,
        ),
    ):
        return replace(
            value, **{f.name: _rename(getattr(value, f.name), mapping) for f in fields(value)}
        )
    return value  # numbers, enums, configs


def inlined(graph: Graph, tensor: str) -> bool:
    """Scalar constants are written into the source as literals, not read."""
    c = graph.constants.get(tensor)
    return c is not None and c.size == 1


def structural_hash(graph: Graph, spec: KernelSpec) -> str:
    """Equal for kernels that generate the same source: same template, ops,
    attributes, shapes, dtypes, wiring, outputs, inlined constants, launch
    configuration and device-checked gathers, whatever the tensors are called."""
    local = {n: i for i, n in enumerate(spec.nodes)}
    ext = {t: i for i, t in enumerate(spec.inputs)}
    parts = [spec.template, repr(spec.config)]
    for t in spec.inputs:
        part = f"in{graph.types[t]}"
        if inlined(graph, t):
            part += "=" + repr(graph.constants[t].reshape(()).item())
        parts.append(part)
    for n in spec.nodes:
        node = graph.producer[n]
        refs = ",".join(f"n{local[i]}" if i in local else f"x{ext[i]}" for i in node.inputs)
        parts.append(f"{node.op.value}({refs}){node.type}{sorted(node.attrs.items())}")
    parts.append("out" + ",".join(str(local[o]) for o in spec.outputs))
    parts.append("opt" + ",".join(str(local[o]) for o in spec.optional))
    if spec.checks:  # (absent otherwise: the hashes of plans made before stay valid)
        parts.append("chk" + ",".join(str(local[o]) for o in spec.checks))
    extra = spec.roles.structure(local, ext)
    if extra is not None:
        parts.append(extra)
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def with_hash(graph: Graph, spec: KernelSpec) -> KernelSpec:
    return replace(spec, hash=structural_hash(graph, spec))


def segment_specs(graph: Graph, spec: KernelSpec) -> tuple[KernelSpec, ...]:
    """A merged matmul's segments, each as the one-matmul spec the matmul
    template reads (its anchor and epilogue, no prologue, the merged spec's
    configuration), or with a norm in the prologue the norm_matmul spec of
    that segment: the fit model, the cost terms and the generator apply per
    segment."""
    roles = spec.roles
    assert isinstance(roles, Siblings)
    template = NORM_MATMUL if roles.prologue else MATMUL
    out = []
    for g in roles.segments:
        nodes = (*roles.prologue, g.anchor, *g.epilogue)
        inputs = dict.fromkeys(i for n in nodes for i in graph.producer[n].inputs if i not in nodes)
        out.append(
            KernelSpec(
                template,
                nodes,
                tuple(inputs),
                tuple(t for t in spec.outputs if t in nodes),
                tuple(t for t in spec.optional if t in nodes),
                graph.producer[g.anchor].shape,
                roles.segment_roles(g),
                spec.config,
            )
        )
    return tuple(out)
