"""Helpers shared by the tests: tiny ONNX models and decomposition checks."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from orchestrate.decompose import fission
from orchestrate.frontend import onnxrt, prepare
from orchestrate.ir import reference
from orchestrate.ir.export import PRIMITIVE_ONNX_OPS, to_onnx


def has_nvidia_backend() -> bool:
    """Whether triton ships its NVIDIA compiler backend, found without
    importing triton (importing it would fix compiled-vs-interpreted mode)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("triton")
    return spec is not None and any(
        (Path(p) / "backends" / "nvidia").is_dir() for p in spec.submodule_search_locations or ()
    )


def elem(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def node_model(
    op_type: str,
    inputs: dict[str, np.ndarray],
    *,
    n_outputs: int = 1,
    constants: dict[str, np.ndarray] | None = None,
    input_order: list[str] | None = None,
    opset: int = 20,
    domain: str = "",
    **attrs,
) -> onnx.ModelProto:
    """A model of one ``op_type`` node of ``domain``.  ``inputs`` become
    graph inputs, ``constants`` initializers; ``input_order`` gives the
    node's argument order (use "" for an omitted optional input)."""
    constants = constants or {}
    order = input_order if input_order is not None else list(inputs) + list(constants)
    outs = [f"y{k}" for k in range(n_outputs)]
    node = helper.make_node(op_type, order, outs, domain=domain, **attrs)
    g = helper.make_graph(
        [node],
        op_type.lower(),
        [helper.make_tensor_value_info(k, elem(v.dtype), v.shape) for k, v in inputs.items()],
        [onnx.ValueInfoProto(name=o) for o in outs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()],
    )
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = 9
    # output types from ONNX shape inference, so the model passes the checker
    return onnx.shape_inference.infer_shapes(m)


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def check_decomposition(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    *,
    rtol: float = 1e-5,
    atol: float | None = 1e-6,
    expected: dict[str, np.ndarray] | None = None,
):
    """Decompose ``model`` and compare, on ``feeds``: the reference executor
    and onnxruntime on the primitive model, against onnxruntime on the
    original (or against ``expected``).  ``atol=None`` judges errors against
    the output's scale: ``atol = rtol * max|want|`` (deep networks accumulate
    float32 rounding that is tiny next to their outputs but not next to a value
    that happens to be near zero).  Returns the primitive graph."""
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    graph = fission(prepare(model, shapes))
    prim = to_onnx(graph)
    onnx.checker.check_model(prim)
    composite = set(op_counts(prim)) - PRIMITIVE_ONNX_OPS
    assert not composite, f"composite ops survived fission: {composite}"
    want = expected if expected is not None else onnxrt.run(model, feeds)
    got_ref = reference.run(graph, feeds)
    got_ort = onnxrt.run(prim, feeds)
    for name, w in want.items():
        tol = atol
        if tol is None:
            finite = np.abs(w[np.isfinite(w)]) if w.dtype.kind == "f" else np.zeros(1)
            tol = rtol * float(finite.max()) if finite.size else 0.0
        for label, got in (("reference", got_ref[name]), ("onnxruntime", got_ort[name])):
            assert got.shape == w.shape, f"{label} {name}: shape {got.shape} != {w.shape}"
            assert got.dtype == w.dtype, f"{label} {name}: dtype {got.dtype} != {w.dtype}"
            np.testing.assert_allclose(
                got.astype(np.float64) if got.dtype != bool else got,
                w.astype(np.float64) if w.dtype != bool else w,
                rtol=rtol,
                atol=tol,
                err_msg=f"{label} output {name}",
            )
    return graph
