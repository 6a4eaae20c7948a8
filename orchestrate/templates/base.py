"""What a template is: a rule, how its kernels are printed, and how they are priced.

A :class:`Template` is data.  Its ``rule`` (``kernels/rule.py``) judges
which sets of primitives it runs and with which launch configuration that
fits on chip; ``generate`` prints the kernel of one spec (None: the
template launches nothing, a view), where a range's dimensions are SymInts
whose formulas it prints and whose ranges decide what it specialises on
(``shapes/symint.py``); the cost terms say what the roofline
(``cost/roofline.py``) needs to know of one of its kernels:

``flops``   (dot flops, other flops): tensor-core and CUDA-core work;
``blocks``  thread blocks in its grid;
``steps``   (dependent loop steps per block, steps in flight at once);
``passes``  how many times it streams its inputs (a looped row reduce: once
            per phase, and once more for its epilogue);
``dot_us``  the time of its dots at their rate;
``terms``   the whole cost, where the roofline's own terms do not apply (a
            library call, which picks its own tiles; a view).

``gemm`` says whether ``--gemm-backends`` governs a Triton template (it runs
matmuls, convolutions or attention, which a library call may run instead).

``scratch`` says what a split configuration (``SPLIT_K`` > 1: several
programs per output tile, the last combining their partial results) needs
of the runner's shared scratch: (fp32 workspace elements, int32 arrival
counters); the default is a split-K matmul's.

``exact`` is for a template whose kernel computes something other than its
primitives one by one (a rewrite: merged siblings, a folded low-rank
branch): the exact check (``check/exact/check.py``) evaluates its kernels
with it, given a ``KernelRun``, and not from the primitives it replaces.

Every template is one line of the registry (``templates/__init__.py``);
the rule table, the cost model and the emitter iterate the registry and
never dispatch on a template's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrate.cost import terms
from orchestrate.cost.devices import Device
from orchestrate.ir import Graph
from orchestrate.kernels.rule import Rule
from orchestrate.kernels.spec import KernelSpec, split_k_scratch

# (graph, spec, writes, function name)
Generate = Callable[[Graph, KernelSpec, Sequence[str], str], object]
Counts = Callable[[Graph, KernelSpec], tuple[int, int]]
# (bytes, flops, memory µs, compute µs, launch µs[, latency µs, blocks])
Terms = Callable[[Graph, KernelSpec, Device], tuple]


@dataclass(frozen=True)
class Template:
    rule: Rule
    generate: Generate | None
    flops: Counts = terms.elementwise_flops
    blocks: Callable[[Graph, KernelSpec], int] = terms.one_block
    steps: Counts = terms.no_loop
    passes: Callable[[Graph, KernelSpec], int] = terms.once
    dot_us: Callable[[Graph, KernelSpec, int, Device], float] = terms.anchor_dot_us
    terms: Terms | None = None
    gemm: bool = False
    scratch: Counts = split_k_scratch
    exact: Callable[[object], dict] | None = None

    @property
    def name(self) -> str:
        return self.rule.name
