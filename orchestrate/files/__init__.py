"""Rules every command that writes follows: the user's umask, early checks of
the output location, and never touching the input it reads.

Kept free of the heavy stages so the CLI can check an output location before
any work starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from pathlib import Path

from orchestrate.errors import InputError

_umask: int | None = None
_umask_lock = threading.Lock()


def umask() -> int:
    """The process umask.  Linux's /proc tells it without changing it;
    elsewhere it is set and put back, which races with another thread
    creating a file at that instant, so that is done once, under a lock."""
    global _umask
    try:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    with _umask_lock:
        if _umask is None:
            old = os.umask(0o022)
            os.umask(old)
            _umask = old
        return _umask


def folder_mode() -> int:
    return 0o777 & ~umask()


def file_mode() -> int:
    return 0o666 & ~umask()


def check_folder_writable(folder: Path, what: str) -> None:
    """``folder`` exists, is a folder, and new entries can be made in it."""
    if not folder.exists():
        raise InputError(f"{what}: folder {folder} does not exist")
    if not folder.is_dir():
        raise InputError(f"{what}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what}: folder {folder} is not writable")


# the manifest's format of every bundle orchestrate writes (``bundle.BUNDLE_FORMAT``)
BUNDLE_PREFIX = "orchestrate-bundle/"


def bundle_folder(folder: Path) -> bool:
    """Whether ``folder`` is a bundle orchestrate wrote (its manifest says so)."""
    import json

    try:
        doc = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and str(doc.get("format", "")).startswith(BUNDLE_PREFIX)


def check_not_in_a_bundle(path: Path, what: str) -> None:
    """Refuse to write ``path`` inside a bundle: a bundle is replaced whole,
    by optimize, or not at all (a file written into it would make it one
    that load refuses, or replace what it reads)."""
    if bundle_folder(path.resolve().parent if what == "file" else path.resolve()):
        where = path.parent if what == "file" else path
        raise InputError(f"{path}: is inside the bundle {where}; refusing to write into a bundle")


def check_output_file(path: Path) -> None:
    """``path`` can be written as a new or replaced regular file, outside any bundle."""
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected a file name")
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: exists and is not a regular file; refusing to replace it")
    check_folder_writable(path.parent, str(path))
    check_not_in_a_bundle(path, "file")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_not_input(
    out: str | os.PathLike, source: str | os.PathLike | None, what: str = "the input model"
) -> None:
    """Refuse an output that would overwrite or delete ``source`` (symlinks
    resolved): the same file, or a folder that holds it.  For the input model,
    an existing file in the model's folder is also checked against the
    model's external data files (whatever the model file is called)."""
    if source is None:
        return
    out_r, src_r = Path(out).resolve(), Path(source).resolve()
    if out_r == src_r:
        raise InputError(f"{out}: is {what} ({source}); refusing to overwrite it")
    if out_r in src_r.parents:
        raise InputError(f"{out}: holds {what} ({source}); refusing to replace it")
    if what == "the input model" and out_r.is_file() and _inside(out_r, src_r.parent):
        for data in _external_data(src_r):
            if data == out_r:
                raise InputError(
                    f"{out}: is external data of {what} ({source}); refusing to overwrite it"
                )


def _external_data(model: Path) -> set[Path]:
    """The files the model's external-data tensors name (without reading
    them); empty when the model cannot be parsed."""
    import onnx

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:  # noqa: BLE001 - the command reports a bad model itself
        return set()
    out = set()
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        tensors = list(graph.initializer)
        for node in graph.node:
            for a in node.attribute:
                tensors += ([a.t] if a.HasField("t") else []) + list(a.tensors)
                graphs += ([a.g] if a.HasField("g") else []) + list(a.graphs)
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                out |= {
                    (model.parent / e.value).resolve()
                    for e in t.external_data
                    if e.key == "location"
                }
    return out


def is_plain_file(path: Path) -> bool:
    """A regular file, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


_HELD = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def signals_held():
    """Delay SIGINT, SIGTERM and SIGHUP until the block ends, so a rename and
    its undo, or a cleanup, is never cut in half (where the platform can)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
