"""orchestrate: ONNX -> operator fission -> optimal fused Triton kernels.

Python API::

    import onnx, orchestrate
    prim = orchestrate.decompose(onnx.load("model.onnx"), shapes={"x": (1, 128)})
    orchestrate.optimize("model.onnx", "model.orch", shapes={"x": (1, 128)})
    outputs = orchestrate.load("model.orch").run({"x": x})
"""

from orchestrate.errors import GraphError, InputError, OrchestrateError, UnsupportedError
from orchestrate.version import __version__


def decompose(model, shapes=None):
    """The primitive-level ONNX model of ``model``: every composite operator
    split into primitives, graph input and output names kept.

    ``shapes`` binds dynamic input dimensions: ``{"input_ids": (1, 128)}``.
    Raises :class:`InputError` naming a bad argument or model and
    :class:`UnsupportedError` naming any op type, attribute or dtype without a
    decomposition.  (Importing the subpackage ``orchestrate.decompose`` puts it
    in this function's place; it is callable the same way.)
    """
    from orchestrate.decompose import decompose as _decompose

    return _decompose(model, shapes)


def optimize(model_path, out_dir, **options):
    """Fission, plan, emit and verify a model; write the bundle to ``out_dir``.
    See :func:`orchestrate.api.optimize` for the options."""
    from orchestrate.api import optimize as _optimize

    return _optimize(model_path, out_dir, **options)


def load(out_dir, **options):
    """Load a bundle (hashes checked); ``.run(inputs) -> outputs``."""
    from orchestrate.api import load as _load

    return _load(out_dir, **options)


__all__ = [
    "decompose",
    "optimize",
    "load",
    "OrchestrateError",
    "UnsupportedError",
    "InputError",
    "GraphError",
    "__version__",
]
