"""Measurement records: what ``orchestrate records export OUT.jsonl`` writes
(``tune/export.py``).

One JSON object per line, one line per measurement in the cache, the
training data of a learned cost model.  Every line carries:

``schema``        ``RECORDS_SCHEMA``; a change of meaning or a removed field
                  bumps it, a new field does not
``spec_hash``     the spec's structural hash (ops, shapes, dtypes, configuration)
``template``      the rule's template: pointwise, row_reduce, matmul, conv, ...
``ops``           the primitives' ops, in graph order
``nodes``         per primitive: op, inputs (``n<i>``: the i-th primitive,
                  ``x<j>``: the j-th kernel input), shape, dtype, attributes
``inputs``        per tensor read: shape, dtype, whether it is a weight (and
                  a scalar weight's ``value``, written into the source)
``outputs``       per tensor written: the primitive (``n<i>``), shape, dtype
``space``         the iteration space; ``dtype`` the spec's (its anchor's
                  operands', else its first output's)
``config``        the launch configuration: block sizes, num_warps,
                  num_stages, fp32 dot precision
``rank``          the configuration's place in the cost model's order (0: its
                  first choice)
``bytes``, ``flops``, ``dot_flops``, ``blocks``
                  what the cost model counts: device-memory bytes moved,
                  all flops, the tensor-core (or FMA) dot flops, grid size
``model``         the model's terms, µs: memory, compute, latency, launch
``device``        the figures of the ``orchestrate/cost/devices.py`` row the
                  prediction used (name, bandwidth, peaks, SMs, shared
                  memory, arch, ...) and ``gpu``, the name of the GPU measured
``predicted_us``  the cost model's time for this spec and configuration
``measured_us``   the measured time of one launch
``method``        how it was timed; ``fake``: true when the figure was made
                  up (``tune.timer.FakeTimer``), never a measurement
``triton``, ``driver``, ``timestamp`` (ISO 8601, UTC)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from orchestrate.cost.devices import Device
from orchestrate.cost.roofline import cost, split_flops
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, inlined
from orchestrate.tune.cache import Row

RECORDS_SCHEMA = "orchestrate-records/1"


def spec_dtype(graph: Graph, spec: KernelSpec) -> str:
    """The dtype a spec computes in: its anchor's first operand's, else its first output's."""
    anchor = spec.anchor
    node = graph.producer.get(anchor) if anchor is not None else None
    if node is not None and node.inputs:
        return graph.types[node.inputs[0]].dtype
    return graph.types[spec.outputs[0]].dtype


def describe(graph: Graph, spec: KernelSpec, device: Device, rank: int) -> dict[str, Any]:
    """Everything a record says of ``spec`` besides the measurement."""
    local = {n: i for i, n in enumerate(spec.nodes)}
    ext = {t: i for i, t in enumerate(spec.inputs)}
    nodes = []
    for n in spec.nodes:
        node = graph.producer[n]
        refs = [f"n{local[i]}" if i in local else f"x{ext[i]}" for i in node.inputs]
        nodes.append(
            {
                "op": node.op.value,
                "inputs": refs,
                "shape": list(node.shape),
                "dtype": node.dtype,
                "attrs": {k: _plain(v) for k, v in sorted(node.attrs.items())},
            }
        )
    c = cost(graph, spec, device)
    dots, _ = split_flops(graph, spec)
    return {
        "template": spec.template,
        "ops": [x["op"] for x in nodes],
        "nodes": nodes,
        "inputs": [_input(graph, t) for t in spec.inputs],
        "outputs": [
            {
                "node": f"n{local[t]}",
                "shape": list(graph.types[t].shape),
                "dtype": graph.types[t].dtype,
            }
            for t in spec.outputs
        ],
        "space": list(spec.space),
        "dtype": spec_dtype(graph, spec),
        "config": spec.config.to_json(),
        "rank": rank,
        "bytes": c.bytes,
        "flops": c.flops,
        "dot_flops": dots,
        "blocks": c.blocks,
        "model": {
            "memory_us": c.memory_us,
            "compute_us": c.compute_us,
            "latency_us": c.latency_us,
            "launch_us": c.launch_us,
        },
        "device": dataclasses.asdict(device),
    }


def _input(graph: Graph, t: str) -> dict[str, Any]:
    """A tensor the kernel reads: a weight's scalar value is written into
    the kernel's source, so it is part of the record."""
    out = {
        "shape": list(graph.types[t].shape),
        "dtype": graph.types[t].dtype,
        "weight": t in graph.constants,
    }
    if inlined(graph, t):
        out["value"] = _plain(graph.constants[t].reshape(()).item())
    return out


def line(row: Row) -> dict[str, Any]:
    """The exported record of one cache row."""
    rec = dict(row.record)
    device = {**rec.pop("device", {}), "gpu": row.key.device}
    return {
        "schema": RECORDS_SCHEMA,
        "spec_hash": row.key.spec_hash,
        **rec,
        "device": device,
        "predicted_us": row.predicted_us,
        "measured_us": row.measured_us,
        "method": rec.get("method", ""),
        "fake": row.fake,
        "triton": row.key.triton,
        "driver": row.key.driver,
        "timestamp": row.created,
    }


def _plain(v):
    """An attribute as JSON: tuples as lists, numpy scalars as numbers,
    non-finite floats as strings (JSON has none)."""
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
