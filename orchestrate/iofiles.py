"""Reading `orchestrate run` inputs and writing its outputs as .npy files."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from orchestrate.errors import InputError


def read_inputs(files: dict[str, Path]) -> dict[str, np.ndarray]:
    out = {}
    for name, path in files.items():
        if not path.is_file():
            raise InputError(f"--input {name}={path}: no such file")
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise InputError(f"--input {name}={path}: not a .npy array ({e})") from None
        if not isinstance(out[name], np.ndarray):
            raise InputError(f"--input {name}={path}: expected one array, found an archive")
    return out


def file_name(tensor: str) -> str:
    return (re.sub(r"[^0-9A-Za-z_.-]+", "_", tensor).strip("._") or "output") + ".npy"


def check_output_dir(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--output-dir {folder}: exists and is not a folder")
    if not folder.parent.is_dir():
        raise InputError(f"--output-dir {folder}: folder {folder.parent} does not exist")


def write_outputs(outputs: dict[str, np.ndarray], folder: Path) -> list[Path]:
    """All outputs or none: written to a temporary folder, then moved."""
    check_output_dir(folder)
    names = [file_name(t) for t in outputs]
    if len(set(names)) != len(names):
        raise InputError("two outputs map to the same file name")
    tmp = Path(tempfile.mkdtemp(prefix=".orchestrate-out.", dir=folder.parent))
    try:
        for arr, fname in zip(outputs.values(), names):
            np.save(tmp / fname, arr, allow_pickle=False)
        folder.mkdir(exist_ok=True)
        written = []
        for fname in names:
            os.replace(tmp / fname, folder / fname)
            written.append(folder / fname)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written
