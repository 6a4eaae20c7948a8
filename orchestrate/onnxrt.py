"""Running ONNX models in onnxruntime (the reference every check compares to)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

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


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of ``model`` on ``feeds`` by name, from onnxruntime on the CPU."""
    s = session(model)
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, dict(feeds))))
