"""Every candidate kernel the planner may choose, emitted and run on its own.

A plan runs the few kernels the linear program picked for one device; a
different device, memory budget or cost model picks others.  So for each model
here, every distinct candidate (enumerated, attention rule included, minus
those whose working set does not fit) is cut out as a graph of its own, fed
the values its inputs take in the whole model (from the reference executor, so
masks, indices and magnitudes are realistic), emitted, run in the Triton
interpreter, and compared with the float64 reference on every tensor it may
write.  Structurally identical candidates (a transformer's layers) run once.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from examples import export_example
from orchestrate import ir
from orchestrate.check.verify import random_inputs
from orchestrate.ilp.partition import partition
from orchestrate.ir import reference, type_rules
from orchestrate.kernels.spec import LIBRARY, KernelSpec
from orchestrate.plan import pipeline
from orchestrate.plan.candidates import Limits, enumerate_kernels
from orchestrate.plan.planner import PlanOptions
from tests.emit_util import one_kernel, run_plan, target

# masked-out lanes compute on neutral values (inf - inf) in the interpreter
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def candidates(graph: ir.Graph, device: str = "h100") -> list[KernelSpec]:
    """The distinct candidates the planner would price, in partition order
    (the rules' own fit check included)."""
    seen, out = set(), []
    for part in partition(graph):
        for k in enumerate_kernels(graph, part.nodes, target(device), Limits()).kernels:
            if k.hash not in seen:
                seen.add(k.hash)
                out.append(k)
    return out


def standalone(graph: ir.Graph, k: KernelSpec) -> ir.Graph:
    """``k`` as a graph of its own: its inputs become graph inputs (constants
    stay constants), everything it may write becomes an output."""
    nodes = tuple(graph.producer[n] for n in k.nodes)
    consts = {t: graph.constants[t] for n in nodes for t in n.inputs if t in graph.constants}
    inputs = tuple(ir.Input(t, graph.types[t]) for t in k.inputs if t not in graph.constants)
    outputs = tuple(dict.fromkeys(k.outputs + k.optional))
    return type_rules.validate(ir.Graph(nodes, inputs, outputs, consts, "candidate"))


def _close(got: np.ndarray, want: np.ndarray, inputs=()) -> bool:
    """Within float32 rounding of the values involved: the absolute
    tolerance scales with the largest input or output magnitude, so a sum
    that cancels to near zero (of a layer norm's output) is not misjudged."""
    if got.dtype.kind in "biu":
        return np.array_equal(got, want.astype(got.dtype))
    scale = max([_largest(want)] + [_largest(x) for x in inputs if x.dtype.kind == "f"])
    return np.allclose(got.astype(np.float64), want, rtol=1e-4, atol=1e-5 * scale, equal_nan=True)


def _largest(x: np.ndarray) -> float:
    finite = np.isfinite(x)
    return float(np.abs(x[finite]).max()) if finite.any() else 1.0


def candidate_failures(graph: ir.Graph, feeds: dict[str, np.ndarray]) -> tuple[int, list[str]]:
    """(number of distinct candidates, what went wrong with them): each run
    on its own on the values its inputs take in ``graph`` under ``feeds``.
    Any exception is a failure: emission may not refuse a spec."""
    everything = dataclasses.replace(graph, outputs=tuple(n.name for n in graph.nodes))
    values = {**reference.run(everything, feeds), **feeds}
    found = candidates(graph)
    failures = []
    for k in found:
        sub = standalone(graph, k)
        library = PlanOptions(gemm_backends=("library",)) if k.template in LIBRARY else None
        plan = one_kernel(sub, library)
        assert plan.specs[0].template == k.template
        inputs = {i.name: values[i.name] for i in sub.inputs}
        ops = " ".join(graph.producer[n].op.value for n in k.nodes)
        try:
            got, _ = run_plan(sub, plan, inputs)
        except Exception as e:  # noqa: BLE001 - collected, reported below
            failures.append(f"{k.template} [{ops}]: {type(e).__name__}: {str(e)[:300]}")
            continue
        want = reference.run(sub, inputs, float64=True)
        bad = [o for o in sub.outputs if not _close(got[o], want[o], inputs.values())]
        if bad:
            failures.append(f"{k.template} [{ops}]: wrong {', '.join(bad)}")
    return len(found), failures


def run_every_candidate(graph: ir.Graph) -> int:
    found, failures = candidate_failures(graph, random_inputs(graph, seed=1))
    assert not failures, f"{len(failures)} of {found} candidates:\n" + "\n".join(failures)
    return found


FAST = [("bert", True), ("vit", True), ("resnet", False)]
SLOW = [(n, d) for n in ("gpt2", "llama", "t5", "mobilenet", "unet", "inception") for d in (0, 1)]


@pytest.mark.parametrize(
    "name, dynamo",
    FAST + [pytest.param(n, bool(d), marks=pytest.mark.slow) for n, d in SLOW],
)
def test_every_candidate_of_an_example_runs_correctly(tmp_path, name, dynamo):
    src = tmp_path / f"{name}.onnx"
    export_example(name, src, dynamo=dynamo, opset=18 if dynamo else 17, size="tiny")
    assert run_every_candidate(pipeline.fission_file(src)) > 50


def test_every_candidate_of_the_demo_model_runs_correctly():
    assert run_every_candidate(pipeline.fission_file("examples/models/tiny_bert.onnx")) > 300
