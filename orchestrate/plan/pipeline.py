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

from orchestrate import frontend, ir, templates
from orchestrate.decompose import fission
from orchestrate.errors import InputError
from orchestrate.files import check_not_input, check_output_file, file_mode, signals_held
from orchestrate.ir.export import to_onnx


def load(
    path: str | os.PathLike, constants: Mapping[str, object] | None = None, option="constants"
) -> onnx.ModelProto:
    """The checked model at ``path``, with the inputs ``constants`` names
    bound to its values (``frontend/constants.py``; errors name ``option``)."""
    from orchestrate.frontend.constants import bind_constants, check_constants

    constants = check_constants(constants, option)
    return bind_constants(frontend.load(path), constants, str(path), option)


def fission_model(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None,
    source: str,
    *,
    option: str = "--shape",
) -> ir.Graph:
    """``option`` names ``shapes`` in errors: ``--shape``, or the API's ``shapes``."""
    return fission(frontend.prepare(model, shapes, source, option=option), source, consume=True)


def fission_file(path: str | os.PathLike, shapes=None, constants=None) -> ir.Graph:
    # the original is freed here
    prepared = frontend.prepare(load(path, constants, "--const"), shapes, str(path))
    return fission(prepared, str(path), consume=True)


def plan_graph(graph: ir.Graph, options=None, progress=None, tune=None, admit=None):
    """The planner's result (``orchestrate.plan.Planned``); ``tune`` (a
    ``tune.Tune``) prices by measurement; ``admit`` refuses kernels beyond
    the rules (a dynamic plan's range)."""
    from orchestrate.plan.planner import PlanOptions, plan

    return plan(graph, options or PlanOptions(), progress, tune, admit)


def write_plan(result, output: str | os.PathLike) -> None:
    """Write a ``Plan`` as PLAN.json."""
    import json

    write_atomic(Path(output), (json.dumps(result.to_json(), indent=1) + "\n").encode())


def read_plan(path: str | os.PathLike):
    """The ``Plan`` in a PLAN.json file."""
    import json

    from orchestrate.plan import Plan

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        result = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not a JSON plan ({e})") from None
    return Plan.from_json(result, templates.NAMES, str(path))


def write_primitive_onnx(graph: ir.Graph, output: str | os.PathLike, name: str = "graph") -> None:
    model = to_onnx(graph, name=name)
    data = model.SerializeToString() if model.ByteSize() < 2**31 - 1 else None
    if data is None:
        raise InputError(f"{output}: primitive model exceeds the 2 GiB protobuf limit")
    write_atomic(Path(output), data)


def check_output_path(
    path: str | os.PathLike, source: str | os.PathLike | None = None, what: str = "the input model"
) -> None:
    """Fail early, before any long work, when ``path`` cannot be written, or
    would overwrite ``source``, the file the command reads (symlinks resolved)."""
    path = Path(path)
    check_output_file(path)
    check_not_input(path, source, what)


def write_atomic(
    path: Path, data: bytes, source: str | os.PathLike | None = None, what: str = "the input model"
) -> None:
    """Write ``data`` to ``path`` so that a failure or a signal leaves nothing
    behind; the file gets the user's umask."""
    check_output_path(path, source, what)
    tmp = None
    try:
        with signals_held():  # a signal held here is raised as the block ends
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        with signals_held():
            os.replace(tmp, path)
            tmp = None
    except BaseException as e:
        if tmp is not None:
            with signals_held():
                Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise InputError(f"{path}: cannot write it ({e.strerror or e})") from None
        raise
