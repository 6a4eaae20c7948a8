"""Inputs bound to values: ``--const NAME=VALUE`` and the API's ``constants=``.

A bound input stops being an input: it becomes an initializer of the model
before anything else reads it, so the frontend folds what depends on it (an
``If`` on a sample rate, a ``Where`` on a flag) and the bundle's interface no
longer has it.  The bundle records the values (``bundle.json``'s
``constants``), so ``verify`` binds the model the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from orchestrate import text
from orchestrate.errors import InputError
from orchestrate.frontend import tensor_dims


def parse_const(text: str, option: str = "--const") -> tuple[str, list[str]]:
    """``NAME=VALUE`` or ``NAME=V1,V2,...`` as (name, value texts)."""
    name, sep, value = text.rpartition("=")
    if not sep or not name or not value.strip():
        raise InputError(f"{option} {text!r}: expected NAME=VALUE, e.g. {option} sr=16000")
    return name, [v.strip() for v in value.split(",")]


def check_constants(constants, option: str = "constants") -> dict[str, object]:
    """``constants`` as a dict of name -> value (numbers, lists, arrays, or
    the texts ``--const`` gives); InputError naming ``option`` otherwise."""
    if constants is None:
        return {}
    if not isinstance(constants, Mapping):
        raise InputError(
            f"{option}: expected a mapping of input name to value, got {type(constants).__name__}"
        )
    for k in constants:
        if not isinstance(k, str):
            raise InputError(f"{option}: input names are strings, got {k!r}")
    return dict(constants)


def _numbers(value: list[str], dtype: np.dtype) -> list:
    if dtype == np.bool_:
        words = {"true": True, "1": True, "false": False, "0": False}
        if any(v.lower() not in words for v in value):
            raise ValueError("expected true, false, 1 or 0")
        return [words[v.lower()] for v in value]
    return [int(v, 0) for v in value] if dtype.kind in "iu" else [float(v) for v in value]


def _array(name: str, value, vi: onnx.ValueInfoProto, option: str) -> np.ndarray:
    """``value`` as input ``name``'s dtype and shape: a declared shape takes
    as many values as it has elements (a scalar for ``[]`` or ``[1]``); a
    dynamic one takes the values' own shape (a list for a 1-D input)."""
    dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    where = f"{option} {name}"
    try:
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            value = _numbers(list(value), dtype)
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{arr.dtype.name} values")
        cast = arr.astype(dtype)
        if (
            not np.array_equal(cast.astype(np.float64), arr.astype(np.float64))
            and dtype.kind != "f"
        ):
            raise ValueError(f"{arr.tolist()} is not a {dtype.name} value")
    except (TypeError, ValueError, OverflowError) as e:
        raise InputError(f"{where}: not a value of input {name!r} ({dtype.name}): {e}") from None
    dims = tensor_dims(vi)
    if all(isinstance(d, int) for d in dims):
        if cast.size == int(np.prod(dims)):
            return cast.reshape(dims)
    elif len(dims) == cast.ndim and all(
        not isinstance(d, int) or d == s for d, s in zip(dims, cast.shape)
    ):
        return cast
    elif len(dims) == 1 and cast.ndim == 0:
        return cast.reshape(1)
    shown = "x".join(str(d) if isinstance(d, int) else "?" for d in dims) or "a scalar"
    raise InputError(
        f"{where}: input {name!r} is {shown}, got {cast.size} "
        f"value{'s' if cast.size != 1 else ''} of shape {list(cast.shape)}"
    )


def bind_constants(
    model: onnx.ModelProto,
    constants: Mapping[str, object],
    source: str,
    option: str = "constants",
) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs named in ``constants`` are
    initializers of those values (``model`` itself when there are none)."""
    if not constants:
        return model
    inits = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    for name in constants:
        if name not in inputs:
            known = ", ".join(map(text.shown, sorted(inputs))) or "none"
            raise InputError(
                f"{option} {name}: {source} has no input {name!r} (its inputs: {known})"
            )
    arrays = {k: _array(k, v, inputs[k], option) for k, v in constants.items()}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [i for i in out.graph.input if i.name not in arrays]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(a, k) for k, a in sorted(arrays.items()))
    return out


def recorded(model: onnx.ModelProto, constants: Mapping[str, object]) -> dict[str, list]:
    """The values a bundle records: each bound input's value as a list."""
    if not constants:
        return {}
    bound = {t.name: t for t in model.graph.initializer if t.name in constants}
    return {k: numpy_helper.to_array(bound[k]).tolist() for k in sorted(constants)}
