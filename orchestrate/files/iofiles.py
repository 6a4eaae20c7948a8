"""Reading `orchestrate run` inputs and writing its outputs as .npy files,
all or none."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from orchestrate.errors import InputError
from orchestrate.files import check_folder_writable, check_not_in_a_bundle, signals_held


def read_inputs(files: dict[str, Path]) -> dict[str, np.ndarray]:
    """The arrays in ``files`` (NAME -> .npy path), in native byte order."""
    out = {}
    for name, path in files.items():
        if not path.is_file():
            raise InputError(f"--input {name}={path}: no such file")
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise InputError(f"--input {name}={path}: not a .npy array ({e})") from None
        if not isinstance(arr, np.ndarray):
            raise InputError(f"--input {name}={path}: expected one array, found an archive")
        if not arr.dtype.isnative:  # e.g. np.save of a '>f4' array: same values, native order
            arr = arr.astype(arr.dtype.newbyteorder("="))
        out[name] = arr
    return out


def file_name(tensor: str) -> str:
    return (re.sub(r"[^0-9A-Za-z_.-]+", "_", tensor).strip("._") or "output") + ".npy"


def check_output_dir(folder: Path) -> None:
    """Fail early, before the run, when ``folder`` cannot take the outputs."""
    what = f"--output-dir {folder}"
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{what}: exists and is not a folder")
    check_folder_writable(folder if folder.exists() else folder.parent, what)
    if folder.exists():
        check_not_in_a_bundle(folder, "folder")


def check_destinations(
    outputs: Iterable[str], folder: Path, inputs: Mapping[str, Path] | None = None
) -> dict[str, Path]:
    """Each output's file in ``folder``, checked (before the run, and again
    before writing): one file per output, no folder standing at a file's
    place, no --input file overwritten."""
    inputs = inputs or {}
    by_file: dict[str, str] = {}
    for tensor in outputs:
        fname = file_name(tensor)
        if fname in by_file:
            raise InputError(
                f"--output-dir {folder}: outputs {by_file[fname]!r} and {tensor!r} both map "
                f"to the file name {fname}"
            )
        by_file[fname] = tensor
    read = {p.resolve(): name for name, p in inputs.items()}
    dest = {}
    for fname, tensor in by_file.items():
        path = folder / fname
        if path.is_dir():
            raise InputError(f"--output-dir {folder}: {path} (output {tensor!r}) is a folder")
        if os.path.lexists(path) and not path.is_file():
            raise InputError(
                f"--output-dir {folder}: {path} (output {tensor!r}) is not a regular file"
            )
        if path.resolve() in read:
            raise InputError(
                f"--output-dir {folder}: {path} (output {tensor!r}) is the file of "
                f"--input {read[path.resolve()]}; refusing to overwrite it"
            )
        dest[tensor] = path
    return dest


def write_outputs(
    outputs: dict[str, np.ndarray], folder: Path, inputs: Mapping[str, Path] | None = None
) -> list[Path]:
    """All outputs or none: every destination is checked, the arrays are
    written to a temporary folder inside ``folder``, then moved in; files they
    replace are moved aside first and put back if any move fails.  Nothing
    temporary is left on any path, signals included."""
    check_output_dir(folder)
    dest = check_destinations(outputs, folder, inputs)
    created = tmp = None
    try:
        with signals_held():  # a signal held here is raised as the block ends
            if not folder.exists():
                folder.mkdir()
                created = folder
            tmp = Path(tempfile.mkdtemp(prefix=".orchestrate-out.", dir=folder))
        (tmp / "new").mkdir()
        (tmp / "old").mkdir()
        for i, tensor in enumerate(dest):
            with open(tmp / "new" / str(i), "wb") as f:  # mode from the umask
                np.save(f, outputs[tensor], allow_pickle=False)
        with signals_held():
            _move_in(list(dest.values()), tmp)
    except BaseException as e:
        with signals_held():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp = None
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
        if isinstance(e, OSError):
            raise InputError(f"--output-dir {folder}: cannot write the outputs ({e})") from None
        raise
    finally:
        if tmp is not None:
            with signals_held():
                shutil.rmtree(tmp, ignore_errors=True)
    return list(dest.values())


def _move_in(paths: list[Path], tmp: Path) -> None:
    """Move tmp/new/<i> to paths[i], the old file (if any) to tmp/old/<i>
    first; on a failure undo every move made, then raise."""
    done: list[tuple[int, bool]] = []  # (index, had an old file)
    try:
        for i, path in enumerate(paths):
            had_old = os.path.lexists(path)
            if had_old:
                os.rename(path, tmp / "old" / str(i))
            done.append((i, had_old))
            os.rename(tmp / "new" / str(i), path)
    except OSError:
        for i, had_old in reversed(done):
            path = paths[i]
            if not os.path.lexists(tmp / "new" / str(i)) and os.path.lexists(path):
                os.rename(path, tmp / "new" / str(i))
            if had_old:
                os.rename(tmp / "old" / str(i), path)
        raise
