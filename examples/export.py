"""Torch -> ONNX export of the example models, and random inputs for them.

One function, :func:`export`, wraps ``torch.onnx.export`` for both exporters:
the TorchScript one (``dynamo=False``) and the torch.export one
(``dynamo=True``, needs onnxscript).  Dynamic axes are given the same way for
both, as ``{input: {axis: name}}``; an axis name shared by several inputs is
one symbolic dimension.  The exported file must carry the requested opset:
the dynamo exporter builds opset 18 and converts, and when that conversion
fails it silently keeps 18; converting down to 17 can also leave an invalid
node (Split keeps its opset-18 ``num_outputs``).  :func:`export` checks the
written file and reports both as an :class:`ExportError`.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import torch


class ExportError(RuntimeError):
    """torch could not export the model as asked."""


@dataclass(frozen=True)
class Input:
    """One model input: name, example shape, dtype, value range, dynamic axes.

    Integer inputs are drawn from ``[low, high)``; ``dynamic`` names the axes
    that may be exported as symbolic dimensions, as ``((axis, name), ...)``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    low: int = 0
    high: int = 1
    dynamic: tuple[tuple[int, str], ...] = ()

    def random(self, rng: np.random.Generator, shape: tuple[int, ...] | None = None):
        shape = self.shape if shape is None else shape
        if np.dtype(self.dtype).kind in "iu":
            return rng.integers(self.low, self.high, size=shape).astype(self.dtype)
        return rng.standard_normal(shape).astype(self.dtype)


def token_inputs(batch: int, seq: int, vocab: int, *, mask: bool) -> tuple[Input, ...]:
    """input_ids (ids below ``vocab``), and an attention_mask when ``mask``;
    batch and sequence are the dynamic axes."""
    axes = ((0, "batch"), (1, "sequence"))
    ids = Input("input_ids", (batch, seq), "int64", high=vocab, dynamic=axes)
    if not mask:
        return (ids,)
    return (ids, Input("attention_mask", (batch, seq), "int64", high=2, dynamic=axes))


def attention_mask(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """A padding mask (int64, 1 = token, 0 = padding): each row keeps a random
    non-empty prefix, like a batch of sentences of different lengths."""
    batch, seq = shape
    lengths = rng.integers(1, seq + 1, size=batch)
    return (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)


def random_inputs(
    inputs: Sequence[Input],
    seed: int = 0,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """Random feeds for ``inputs`` (``shapes`` overrides example shapes)."""
    rng = np.random.default_rng(seed)
    shapes = shapes or {}
    feeds = {}
    for i in inputs:
        shape = tuple(shapes.get(i.name, i.shape))
        if i.name == "attention_mask":
            feeds[i.name] = attention_mask(rng, shape)
        else:
            feeds[i.name] = i.random(rng, shape)
    return feeds


def dynamic_axes_of(inputs: Sequence[Input]) -> dict[str, dict[int, str]]:
    return {i.name: dict(i.dynamic) for i in inputs if i.dynamic}


def export(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    path: str | os.PathLike,
    *,
    dynamo: bool,
    opset: int,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
) -> onnx.ModelProto:
    """Export ``model`` called on ``example_inputs`` to ``path``; return the
    written model (weights inside the file, no external data)."""
    args = tuple(example_inputs)
    input_names = list(input_names or _forward_params(model)[: len(args)])
    output_names = list(output_names) if output_names else None
    dynamic_axes = {k: dict(v) for k, v in (dynamic_axes or {}).items() if v}
    kwargs: dict = dict(
        input_names=input_names, output_names=output_names, opset_version=opset, dynamo=dynamo
    )
    if dynamo:
        kwargs.update(
            dynamic_shapes=_dynamic_shapes(input_names, dynamic_axes) if dynamic_axes else None,
            external_data=False,
            verbose=False,
        )
    else:
        kwargs.update(dynamic_axes=dynamic_axes or None, do_constant_folding=True)
    model = model.eval()
    try:
        with _quiet(), _no_fastpath():
            torch.onnx.export(model, args, str(path), **kwargs)
    except Exception as e:
        kind = "dynamo" if dynamo else "torchscript"
        raise ExportError(f"{type(model).__name__}: {kind} export failed: {e}") from e
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise ExportError(
            f"{type(model).__name__}: the exporter wrote an invalid model: {first}"
        ) from None
    written = onnx.load(str(path))
    got = next(o.version for o in written.opset_import if o.domain in ("", "ai.onnx"))
    if got != opset:
        raise ExportError(
            f"{type(model).__name__}: asked for opset {opset}, the exporter wrote opset {got} "
            "(its version converter could not convert the model)"
        )
    return written


def _forward_params(model: torch.nn.Module) -> list[str]:
    return list(inspect.signature(model.forward).parameters)


def _dynamic_shapes(names: Sequence[str], axes: Mapping[str, Mapping[int, str]]):
    """``{input: {axis: name}}`` -> torch.export dynamic_shapes (a tuple in
    argument order); one ``Dim`` per distinct name, and ``name + c`` a
    dimension derived from it (torch.export writes it back as ``name + c``)."""
    dims: dict[str, torch.export.Dim] = {}

    def dim(text: str):
        base, plus, offset = (part.strip() for part in text.partition("+"))
        if base not in dims:
            dims[base] = torch.export.Dim(base, min=2, max=4096)
        return dims[base] + int(offset) if plus else dims[base]

    return tuple(
        {axis: dim(text) for axis, text in axes.get(name, {}).items()} or None for name in names
    )


@contextlib.contextmanager
def _quiet():
    """Silence the exporters' progress lines, warnings and log chatter."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            _native_stdout_discarded(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def _native_stdout_discarded():
    """Discard what native code writes to file descriptor 1: the TorchScript
    exporter prints its whole IR graph there when a conversion fails (its
    setup_onnx_logging tests a function object for truth, so the log is always
    on); the failure itself still reaches the caller as an ExportError."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _no_fastpath():
    """Keep nn.MultiheadAttention / TransformerEncoderLayer off their fused
    inference kernels, which neither exporter can translate."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)
