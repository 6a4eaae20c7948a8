"""Running ONNX models in onnxruntime (the reference every check compares to)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import onnx

from orchestrate.errors import InputError

# the newest ONNX IR version the installed onnxruntime loads; models written
# by a newer onnx package are run with their IR version lowered to it
MAX_IR_VERSION = 10


def session(model: onnx.ModelProto, providers: list[str] | None = None):
    import onnxruntime as ort

    if model.ir_version > MAX_IR_VERSION:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.ir_version = MAX_IR_VERSION
        model = m
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), opts, providers=providers or ["CPUExecutionProvider"]
    )


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
