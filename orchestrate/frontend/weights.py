"""Weights kept in their external-data files, read in place.

A model's external data is never loaded into its protobuf: a protobuf
cannot pass 2 GiB, and LLM exports hold 2-30 GB of weights.  ``bind`` checks
every external tensor of a freshly loaded model (its file inside the
model's folder, long enough for its values) and records the file's absolute
path as the tensor's location; ``array`` then gives any initializer's values,
an external one as a read-only memory map of its file (nothing is read
until a stage reads those values, nothing is copied for onnxruntime).
Every stage reads initializers through ``array``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from orchestrate.errors import InputError

# element types whose bytes in a file are the numpy array's bytes (little endian)
_PLAIN = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.UINT32: np.uint32,
    onnx.TensorProto.UINT64: np.uint64,
    onnx.TensorProto.BOOL: np.bool_,
}


def _fields(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def bind(tensors, path: Path) -> None:
    """Check the external tensors of the model at ``path`` and point each at
    its file by absolute path; InputError names the file and the tensor."""
    base = path.parent.resolve()
    for t in tensors:
        if not uses_external_data(t):
            continue
        f = _fields(t)
        loc = f.get("location", "")
        target = (base / loc).resolve()
        if not loc or os.path.isabs(loc) or base not in target.parents:
            raise InputError(
                f"{path}: tensor {t.name!r} points at external data {loc!r} "
                "outside the model's folder"
            )
        if not target.is_file():
            raise InputError(f"{path}: external data file {loc!r} of {t.name!r} is missing")
        try:
            offset = int(f.get("offset", 0))
            length = int(f["length"]) if "length" in f else None
        except ValueError:
            raise InputError(
                f"{path}: tensor {t.name!r} has a malformed offset or length"
            ) from None
        dtype = _PLAIN.get(t.data_type)
        need = math.prod(t.dims) * np.dtype(dtype).itemsize if dtype is not None else None
        if need is not None and length is not None and length != need:
            raise InputError(
                f"{path}: tensor {t.name!r} declares {length} bytes of external data, "
                f"but its type and dims {list(t.dims)} need {need}"
            )
        size = target.stat().st_size
        if offset < 0 or (need is not None and offset + need > size):
            raise InputError(
                f"{path}: external data file {loc!r} holds {size} bytes, too few for "
                f"{t.name!r} at offset {offset}"
            )
        for e in t.external_data:
            if e.key == "location":
                e.value = str(target)


def array(t: onnx.TensorProto) -> np.ndarray:
    """The values of initializer ``t`` (``bind`` first for an external one)."""
    if not uses_external_data(t):
        return numpy_helper.to_array(t)
    f = _fields(t)
    dtype = _PLAIN.get(t.data_type)
    offset = int(f.get("offset", 0))
    shape = tuple(t.dims)
    if dtype is None:  # packed or special types: the bytes, decoded by onnx
        with open(f["location"], "rb") as file:
            file.seek(offset)
            data = file.read(int(f["length"])) if "length" in f else file.read()
        copy = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=shape, raw_data=data)
        return numpy_helper.to_array(copy)
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype)
    mapped = np.memmap(
        f["location"], dtype=np.dtype(dtype).newbyteorder("<"), mode="r", offset=offset, shape=shape
    )
    return np.asarray(mapped)
