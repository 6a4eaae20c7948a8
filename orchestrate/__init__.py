"""orchestrate: ONNX -> operator fission -> optimal fused Triton kernels.

Python API::

    import onnx, orchestrate
    prim = orchestrate.decompose(onnx.load("model.onnx"), shapes={"x": (1, 128)})
"""

from orchestrate.errors import GraphError, InputError, OrchestrateError, UnsupportedError

__version__ = "0.1.0"


def decompose(model, shapes=None):
    """The primitive-level ONNX model of ``model``: every composite operator
    split into primitives, graph input and output names kept.

    ``shapes`` binds dynamic input dimensions: ``{"input_ids": (1, 128)}``.
    Raises :class:`UnsupportedError` naming any op type, attribute or dtype
    without a decomposition.
    """
    from orchestrate.decompose import decompose as _decompose

    return _decompose(model, shapes)


__all__ = [
    "decompose", "OrchestrateError", "UnsupportedError", "InputError", "GraphError",
    "__version__",
]  # fmt: skip
