"""The compile pipeline, one short function per stage exposed by the CLI.

load      ONNX file -> checked ModelProto             (frontend.load)
prepare   -> static shapes, constants folded           (frontend.prepare)
fission   -> primitive graph                           (decompose.fission)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx

from orchestrate import frontend, ir
from orchestrate.decompose import fission
from orchestrate.errors import InputError
from orchestrate.export import to_onnx


def load(path: str | os.PathLike) -> onnx.ModelProto:
    return frontend.load(path)


def fission_model(
    model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None, source: str
) -> ir.Graph:
    return fission(frontend.prepare(model, shapes, source), source)


def fission_file(path: str | os.PathLike, shapes=None) -> ir.Graph:
    return fission_model(load(path), shapes, str(path))


def write_primitive_onnx(graph: ir.Graph, output: str | os.PathLike, name: str = "graph") -> None:
    model = to_onnx(graph, name=name)
    data = model.SerializeToString() if model.ByteSize() < 2**31 - 1 else None
    if data is None:
        raise InputError(f"{output}: primitive model exceeds the 2 GiB protobuf limit")
    write_atomic(Path(output), data)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a failure leaves nothing behind."""
    parent = path.parent
    if not parent.is_dir():
        raise InputError(f"{path}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
