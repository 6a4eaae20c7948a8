"""Running ONNX models in onnxruntime (the reference every check compares to)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx.external_data_helper import uses_external_data

from orchestrate.errors import InputError
from orchestrate.frontend.weights import array as initializer_array

# the newest ONNX IR version the installed onnxruntime loads; models written
# by a newer onnx package are run with their IR version lowered to it
MAX_IR_VERSION = 10


# initializers of more bytes than this reach onnxruntime as arrays beside the
# model, never inside its serialized protobuf (which cannot pass 2 GiB)
BESIDE_BYTES = 1 << 20
_IN_MEMORY = "orchestrate-in-memory"  # the location a weight handed beside the model names


def session(model: onnx.ModelProto, providers: list[str] | None = None, opts=None):
    """An onnxruntime session of ``model`` (``opts``: SessionOptions to use).

    Large initializers are handed to onnxruntime as arrays
    (``add_external_initializers``), the model itself naming them as
    external data, so a model of any size loads; the arrays live as long
    as the session."""
    import onnxruntime as ort

    if opts is None:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
    skeleton, weights = _weights_beside(model)
    if weights:
        opts.add_external_initializers(
            list(weights), [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()]
        )
    s = ort.InferenceSession(
        skeleton.SerializeToString(), opts, providers=providers or ["CPUExecutionProvider"]
    )
    s.orchestrate_weights = weights  # onnxruntime reads them in place
    return s


def _weights_beside(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy of ``model`` (IR version at most MAX_IR_VERSION) whose large
    initializers are external-data stubs, and those initializers as arrays."""
    big = [t for t in model.graph.initializer if _nbytes(t) > BESIDE_BYTES or uses_external_data(t)]
    if not big and model.ir_version <= MAX_IR_VERSION:
        return model, {}
    names = {t.name for t in big}
    m = onnx.ModelProto()
    graph = model.graph
    kept = [t for t in graph.initializer if t.name not in names]
    # copy everything but the large initializers (copying them would double the memory)
    shell = onnx.GraphProto()
    shell.CopyFrom(onnx.GraphProto(name=graph.name, doc_string=graph.doc_string))
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(shell, field).extend(getattr(graph, field))
    shell.initializer.extend(kept)
    arrays = {t.name: np.ascontiguousarray(initializer_array(t)) for t in big}
    for t in big:
        stub = shell.initializer.add()
        stub.name, stub.data_type = t.name, t.data_type
        stub.dims.extend(t.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        size = str(arrays[t.name].nbytes)
        for key, value in (("location", _IN_MEMORY), ("offset", "0"), ("length", size)):
            entry = stub.external_data.add()
            entry.key, entry.value = key, value
    m.CopyFrom(
        onnx.ModelProto(
            ir_version=min(model.ir_version, MAX_IR_VERSION),
            opset_import=model.opset_import,
            producer_name=model.producer_name,
            functions=model.functions,
            graph=shell,
        )
    )
    return m, arrays


def _nbytes(t: onnx.TensorProto) -> int:
    """The bytes of ``t``'s values, from its type and shape (``ByteSize``
    would serialize it, which fails past 2 GiB)."""
    if t.data_type == onnx.TensorProto.STRING:
        return 0  # never handed beside: onnxruntime takes no string OrtValue this way
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return math.prod(t.dims) * itemsize


def reference(model: onnx.ModelProto, source: str):
    """A CPU session of ``model`` to compare with, or InputError naming
    ``source`` when onnxruntime refuses a model onnx's checker passed."""
    try:
        return session(model)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own Fail/InvalidGraph/...
        raise InputError(
            f"{source}: onnxruntime cannot load the model ({_first_line(e)})"
        ) from None


def run_reference(s, names: list[str], feeds: Mapping[str, np.ndarray], source: str) -> list:
    """``s.run``, with onnxruntime's refusal as an InputError naming ``source``."""
    try:
        return s.run(names, dict(feeds))
    except Exception as e:  # noqa: BLE001 - as above
        raise InputError(f"{source}: onnxruntime cannot run the model ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


@functools.cache
def supports_opset(version: int) -> bool:
    """Whether the installed onnxruntime loads models of ai.onnx opset
    ``version``.  It exposes no such number, so a one-node model says."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y]
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", version)])
    model.ir_version = MAX_IR_VERSION
    try:
        session(model)
    except Exception:  # noqa: BLE001 - onnxruntime raises its own Fail for this
        return False
    return True


def max_opset() -> int:
    """The newest ai.onnx opset, up to the installed onnx's newest, that the
    installed onnxruntime loads."""
    lo, hi = 1, onnx.defs.onnx_opset_version()
    if supports_opset(hi):
        return hi
    while hi - lo > 1:  # lo is supported, hi is not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if supports_opset(mid) else (lo, mid)
    return lo


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of ``model`` on ``feeds`` by name, from onnxruntime on the CPU."""
    s = session(model)
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, dict(feeds))))
