"""The bundle `orchestrate optimize` writes, and loading it back.

    OUT/
      plan.json      the plan (kernels in order, costs, baselines, solver)
      kernels.py     the generated Triton source, one kernel per plan kernel
      weights.npz    constants the kernels read (loaded with allow_pickle=False)
      report.md      the explain table, baselines and verification result
      manifest.json  format, versions, constant names, sha256 of every file
                     (and the inputs --const bound, ``bound_inputs``)
      dims.json      only in a dynamic bundle (``--shape x=1..8x2..64``): its
                     dimensions, their ranges, and the shapes and attributes
                     that are polynomials of them (``shapes/family.py``)
      in_place/      only for a decode step over a range of past lengths: the
                     step over caches kept in place (``frontend/decode.py``),
                     a bundle of its own; the manifest's ``in_place`` holds
                     the sha256 of its manifest.json, the buffers' capacity,
                     each cache's growing axis, and the bucket past lengths
                     are rounded up to (1: none).  Its weights.npz holds only
                     the constants that differ from the outer bundle's; its
                     manifest's ``outer_constants`` names those it takes from
                     the outer weights.npz (checked against the outer
                     manifest), so the weights are stored and loaded once

numpy has no bfloat16 of its own (orchestrate uses ml_dtypes' in memory), and
an .npz of ml_dtypes arrays loads as raw bytes without pickles: a bfloat16
constant is stored as its uint16 bit patterns (the same 2 bytes per value),
and the manifest's ``bfloat16`` lists those constants by name.

The folder is written under a temporary name next to OUT and renamed into
place only when complete, so a failure leaves nothing at OUT.  An existing OUT
is replaced only when it is a bundle exactly as orchestrate wrote it (format,
file set and every hash), and never when it holds the input model.  ``load``
checks every hash in the manifest and refuses a bundle that was changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrate import templates, text
from orchestrate.errors import InputError, check_format
from orchestrate.files import (
    BUNDLE_PREFIX,
    check_folder_writable,
    check_not_input,
    folder_mode,
    is_plain_file,
    signals_held,
)
from orchestrate.ir import ALL_DTYPES, BFLOAT16
from orchestrate.plan import Plan

BUNDLE_FORMAT = BUNDLE_PREFIX + "6"
# what each earlier format lacks, for the message that refuses it
_OLDER = {
    "orchestrate-bundle/1": "one jitted function per distinct kernel spec",
    "orchestrate-bundle/2": "the plan from which load regenerates kernels.py instead of importing it",
    "orchestrate-bundle/3": "the list of bfloat16 constants, stored as uint16 bit patterns",
    "orchestrate-bundle/4": "library kernels (cuBLAS, cuDNN, SDPA) among its kernels",
    "orchestrate-bundle/5": "dynamic shapes (dims.json)",
}
FILES = ("plan.json", "kernels.py", "weights.npz", "report.md")
DIMS = "dims.json"  # a dynamic bundle's family


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


IN_PLACE = "in_place"  # a decode step's in-place bundle, inside the bundle
_NAMES = frozenset((*FILES, DIMS, "manifest.json", IN_PLACE))


def replace_problem(folder: Path) -> str | None:
    """Why the existing ``folder`` is not a bundle this tool wrote and nobody
    changed since (so not safe to replace), or None when it is, or is empty."""
    names = sorted(os.listdir(folder))
    if not names:
        return None
    foreign = [text.shown(n) for n in names if n not in _NAMES]
    if foreign:
        more = f", ... ({len(foreign)} in all)" if len(foreign) > 5 else ""
        return f"holds files an orchestrate bundle does not: {', '.join(foreign[:5])}{more}"
    odd = [n for n in names if not is_plain_file(folder / n) and n != IN_PLACE]
    if odd:
        return f"its {odd[0]} is not a plain file"
    if IN_PLACE in names:
        inner = folder / IN_PLACE
        if inner.is_symlink() or not inner.is_dir():
            return f"its {IN_PLACE} is not a folder"
        problem = replace_problem(inner)
        if problem:
            return f"{IN_PLACE}/ {problem}"
    if "manifest.json" not in names:
        return "manifest.json is missing"
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (ValueError, UnicodeDecodeError):
        return "manifest.json is not valid JSON"
    if not isinstance(manifest, dict):
        return "manifest.json is not a JSON object"
    found = manifest.get("format")
    if not isinstance(found, str) or (found != BUNDLE_FORMAT and found not in _OLDER):
        return "manifest.json does not name an orchestrate bundle format"
    hashes = manifest.get("files")
    if not isinstance(hashes, dict) or set(hashes) not in (set(FILES), {*FILES, DIMS}):
        return "manifest.json does not list the bundle's files"
    if DIMS in names and DIMS not in hashes:
        return f"holds a {DIMS} its manifest does not list"
    for name in hashes:
        if name not in names:
            return f"{name} is missing"
        if sha256(folder / name) != hashes[name]:
            return f"{name} was changed since orchestrate wrote it"
    return None


def check_destination(out: Path, model: str | os.PathLike | None = None) -> Path:
    """Where the bundle for ``out`` goes: OUT may be new, empty, or an earlier
    bundle left as orchestrate wrote it (replaced); never another folder, never
    one that holds ``model``.  A symbolic link OUT stays: the bundle it points
    to is replaced.  Returns that real folder."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise InputError(f"{out}: is a symbolic link to {out.resolve()}, which does not exist")
    target = out.resolve()
    check_not_input(out, model)
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise InputError(f"{out}: holds the current folder; refusing to replace it")
    if target.exists():
        if not target.is_dir():
            raise InputError(f"{out}: exists and is not a folder")
        problem = replace_problem(target)
        if problem:
            raise InputError(
                f"{out}: not an orchestrate bundle ({problem}); refusing to replace it"
            )
    check_folder_writable(target.parent, str(out))
    return target


class Staging:
    """A temporary folder next to OUT that becomes OUT on ``commit``.

    Folder and files get the user's umask; ``commit`` and ``discard`` leave no
    temporary folder behind on any path, and the old bundle is either replaced
    whole or left in place."""

    def __init__(self, out: Path, model: str | os.PathLike | None = None):
        self.out, self.model = Path(out), model
        self.target = check_destination(self.out, model)
        self.path = None
        try:
            with signals_held():  # a signal held here is raised as the block ends
                self.path = Path(
                    tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent)
                )
                os.chmod(self.path, folder_mode())
        except BaseException as e:
            if self.path is not None:
                self.discard()
            if isinstance(e, OSError):
                raise InputError(
                    f"{out}: cannot create a folder beside it ({e.strerror})"
                ) from None
            raise

    def write(
        self,
        plan: Plan,
        kernels_py: str,
        constants: Mapping[str, np.ndarray],
        report: str,
        info: dict,
        dims: dict | None = None,
        folder: str = "",
        outer: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """``dims``: a dynamic bundle's family (``Family.to_json``);
        ``folder``: a bundle inside this one (``IN_PLACE``), whose manifest
        ``info`` of the outer one then names by its sha256; ``outer``: the
        outer bundle's constants, which the inner one does not store again
        where it has the same (name and bytes)."""
        try:
            self._write(plan, kernels_py, constants, report, info, dims, folder, outer)
        except OSError as e:
            raise InputError(f"{self.out}: cannot write the bundle ({e.strerror})") from None

    def manifest_sha256(self, folder: str) -> str:
        return sha256(self.path / folder / "manifest.json")

    def _write(self, plan, kernels_py, constants, report, info, dims, folder, outer) -> None:
        path = self.path / folder
        path.mkdir(mode=folder_mode(), exist_ok=True)
        taken = sorted(
            k for k, v in constants.items() if outer and k in outer and same(v, outer[k])
        )
        constants = {k: v for k, v in constants.items() if k not in taken}
        keys = {name: f"c{i}" for i, name in enumerate(sorted(constants))}
        (path / "plan.json").write_text(json.dumps(plan.to_json(), indent=1) + "\n")
        (path / "kernels.py").write_text(kernels_py)
        with open(path / "weights.npz", "wb") as f:
            np.savez(f, **{keys[k]: stored(_c_order(v)) for k, v in constants.items()})
        (path / "report.md").write_text("\n".join(map(text.shown, report.split("\n"))))
        files = FILES
        if dims is not None:
            (path / DIMS).write_text(json.dumps(dims, indent=1) + "\n")
            files = (*FILES, DIMS)
        manifest = {
            "format": BUNDLE_FORMAT,
            **info,
            "constants": keys,
            **({"outer_constants": taken} if taken else {}),
            "bfloat16": sorted(k for k, v in constants.items() if v.dtype == BFLOAT16),
            "files": {name: sha256(path / name) for name in files},
        }
        (path / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    def commit(self) -> Path:
        """Put the bundle at OUT, replacing the earlier one (checked again:
        it may have changed while this one was built)."""
        target = self.target
        if os.path.lexists(target):
            check_destination(self.out, self.model)
        with signals_held():
            aside = None
            try:
                if os.path.lexists(target):
                    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
                    os.rename(target, aside / "old")
                os.rename(self.path, target)
            except OSError as e:
                if aside is not None and os.path.lexists(aside / "old"):
                    os.rename(aside / "old", target)
                raise InputError(
                    f"{self.out}: cannot put the bundle there ({e.strerror})"
                ) from None
            finally:
                if aside is not None:
                    shutil.rmtree(aside, ignore_errors=True)
        return self.out

    def discard(self) -> None:
        with signals_held():
            shutil.rmtree(self.path, ignore_errors=True)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two constants are stored as the same bytes (dtype, shape and
    every bit: a NaN equals itself, 0.0 differs from -0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = [_c_order(stored(x)).reshape(-1).view(np.uint8) for x in (a, b)]
    return np.array_equal(*bits)


def stored(arr: np.ndarray) -> np.ndarray:
    """``arr`` as weights.npz holds it: a bfloat16 array as its uint16 bit
    patterns, anything else as it is."""
    return arr.view(np.uint16) if arr.dtype == BFLOAT16 else arr


def _c_order(arr: np.ndarray) -> np.ndarray:
    """``arr`` C-ordered, its shape kept (``np.ascontiguousarray`` makes a
    0-d array 1-d, which changes the constant's type in the plan)."""
    return np.ascontiguousarray(arr).reshape(arr.shape)


@dataclass(frozen=True)
class Contents:
    """A bundle's files, each checked against the manifest and parsed."""

    plan: Plan
    constants: dict[str, np.ndarray]
    manifest: dict[str, Any]
    kernels_py: str  # the shipped source: compared with what orchestrate generates, never run
    dims: dict | None = None  # a dynamic bundle's family, as dims.json holds it


def read(folder: str | os.PathLike, outer: Mapping[str, np.ndarray] | None = None) -> Contents:
    """The contents of a bundle.  Every file is read once, its bytes checked
    against the manifest's sha256 and then parsed (so what is checked is what
    is used); anything malformed is an InputError naming the file.  An
    in-place bundle's ``outer_constants`` are taken from ``outer`` (the outer
    bundle's constants, read and checked already) or else read from the
    bundle around it, checked as ``read`` checks it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such bundle folder")
    raw = _bytes(folder, "manifest.json")
    if raw is None:
        raise InputError(f"{folder}: not an orchestrate bundle (manifest.json is missing)")
    manifest = _json(raw, folder, "manifest.json")
    if not isinstance(manifest, dict):
        raise InputError(f"{folder}: manifest.json is not a JSON object")
    check_format(
        manifest.get("format"),
        BUNDLE_FORMAT,
        _OLDER,
        f"{folder}/manifest.json",
        "bundle",
        "run `orchestrate optimize` on the model again",
    )
    _check_manifest(manifest, folder)
    data = {}
    for name in manifest["files"]:
        data[name] = _bytes(folder, name)
        if data[name] is None:
            raise InputError(f"{folder}: {name} is missing")
        if hashlib.sha256(data[name]).hexdigest() != manifest["files"][name]:
            raise InputError(f"{folder}: {name} was modified (sha256 does not match the manifest)")
    plan = Plan.from_json(
        _json(data["plan.json"], folder, "plan.json"), templates.NAMES, f"{folder}/plan.json"
    )
    constants = _weights(data["weights.npz"], manifest["constants"], manifest["bfloat16"], folder)
    if "outer_constants" in manifest:
        constants.update(_outer(folder, manifest["outer_constants"], constants, outer))
    try:
        kernels_py = data["kernels.py"].decode("ascii")
    except UnicodeDecodeError:
        raise InputError(
            f"{folder}: kernels.py is not the ASCII source orchestrate writes"
        ) from None
    dims = _json(data[DIMS], folder, DIMS) if DIMS in data else None
    if dims is not None and not isinstance(dims, dict):
        raise InputError(f"{folder}: {DIMS} is not a JSON object")
    return Contents(plan, constants, manifest, kernels_py, dims)


# what each manifest field must hold: (check, what to say when it does not)
_MANIFEST = {
    "format": (lambda v: isinstance(v, str), "a string"),
    "orchestrate": (lambda v: isinstance(v, str), "a string"),
    "model": (
        lambda v: (
            isinstance(v, dict)
            and set(v) == {"file", "sha256"}
            and all(isinstance(x, str) for x in v.values())
        ),
        'an object {"file": ..., "sha256": ...}',
    ),
    "shapes": (
        lambda v: (
            isinstance(v, dict)
            and all(
                isinstance(d, list) and all(type(x) is int and x >= 0 for x in d)
                for d in v.values()
            )
        ),
        "an object of input name -> list of dimensions",
    ),
    "constants": (
        lambda v: (
            isinstance(v, dict)
            and all(isinstance(x, str) for x in v.values())
            and len(set(v.values())) == len(v)
        ),
        "an object of constant name -> distinct archive key",
    ),
    "bfloat16": (
        lambda v: (
            isinstance(v, list) and all(isinstance(x, str) for x in v) and len(set(v)) == len(v)
        ),
        "a list of distinct constant names",
    ),
    "files": (
        lambda v: (
            isinstance(v, dict)
            and set(v) in (set(FILES), {*FILES, DIMS})
            and all(isinstance(x, str) and re.fullmatch("[0-9a-f]{64}", x) for x in v.values())
        ),
        f"an object of sha256 digests for {', '.join(FILES)} (and {DIMS})",
    ),
}


def _values(v) -> bool:
    """Whether ``v`` is a number, a boolean, or nested lists of them."""
    if isinstance(v, list):
        return all(_values(x) for x in v)
    return isinstance(v, bool | int | float)


# fields a bundle has only when it needs them
_OPTIONAL = {
    # a decode step's in-place bundle (IN_PLACE): its manifest's sha256, the
    # symbol of the past length, the buffers' rows, each cache's growing axis
    "in_place": (
        lambda v: (
            isinstance(v, dict)
            and set(v) == {"manifest", "past", "capacity", "axes", "bucket"}
            and type(v["bucket"]) is int
            and v["bucket"] >= 1
            and isinstance(v["manifest"], str)
            and re.fullmatch("[0-9a-f]{64}", v["manifest"]) is not None
            and isinstance(v["past"], str)
            and type(v["capacity"]) is int
            and v["capacity"] > 0
            and isinstance(v["axes"], dict)
            and all(type(a) is int and a >= 0 for a in v["axes"].values())
        ),
        'an object {"manifest": sha256, "past": name, "capacity": rows, "axes": {cache: axis}, '
        '"bucket": rows}',
    ),
    # an in-place bundle's constants that are the outer bundle's (IN_PLACE)
    "outer_constants": (
        lambda v: (
            isinstance(v, list)
            and all(isinstance(x, str) for x in v)
            and v == sorted(set(v))
            and len(v) > 0
        ),
        "a sorted list of constant names",
    ),
    # inputs bound to values by --const (frontend/constants.py)
    "bound_inputs": (
        lambda v: isinstance(v, dict) and all(_values(x) for x in v.values()),
        "an object of input name -> value",
    ),
}


def _outer(
    folder: Path, names: list[str], own: Mapping[str, np.ndarray], outer
) -> dict[str, np.ndarray]:
    """The constants an in-place bundle at ``folder`` takes from the bundle
    around it (its manifest's ``outer_constants``)."""
    if folder.name != IN_PLACE:
        raise InputError(
            f"{folder}: manifest.json takes constants from an outer bundle, but the "
            f"folder is not a bundle's {IN_PLACE}/"
        )
    twice = sorted(set(names) & set(own))
    if twice:
        raise InputError(
            f"{folder}: constant '{text.shown(twice[0])}' is both in weights.npz and "
            "among the manifest's outer_constants"
        )
    if outer is None:
        outer = read(folder.parent).constants
    missing = sorted(set(names) - set(outer))
    if missing:
        raise InputError(
            f"{folder}: manifest.json takes constant '{text.shown(missing[0])}' from "
            f"{folder.parent}, which holds no such constant"
        )
    return {name: outer[name] for name in names}


def _check_manifest(manifest: dict, folder: Path) -> None:
    for key in manifest:
        if key not in _MANIFEST and key not in _OPTIONAL:
            raise InputError(f"{folder}: manifest.json has an unknown field '{text.shown(key)}'")
    for key, (ok, want) in {**_MANIFEST, **_OPTIONAL}.items():
        if key not in manifest:
            if key in _OPTIONAL:
                continue
            raise InputError(f"{folder}: manifest.json lacks the field {key!r}")
        if not ok(manifest[key]):
            raise InputError(f"{folder}: manifest.json field {key!r} must be {want}")


def _bytes(folder: Path, name: str) -> bytes | None:
    """The bytes of a plain file in the bundle; None when there is none."""
    path = folder / name
    if not is_plain_file(path):
        return None
    try:
        return path.read_bytes()
    except OSError as e:
        raise InputError(f"{folder}: cannot read {name} ({e.strerror})") from None


def _json(raw: bytes, folder: Path, name: str):
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InputError(f"{folder}: {name} is not valid JSON ({e})") from None


def _weights(
    raw: bytes, keys: Mapping[str, str], bf16: list[str], folder: Path
) -> dict[str, np.ndarray]:
    """The constants in weights.npz, by name: plain numeric arrays only (no
    pickled objects), exactly the archive keys the manifest lists; those it
    lists as bfloat16 are uint16 bit patterns, viewed as bfloat16."""
    unknown = sorted(set(bf16) - set(keys))
    if unknown:
        raise InputError(
            f"{folder}: manifest.json lists '{text.shown(unknown[0])}' as bfloat16 but "
            "not among its constants"
        )
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            stored = set(z.files)
            if stored != set(keys.values()):
                extra = sorted(stored ^ set(keys.values()))
                raise InputError(
                    f"{folder}: weights.npz does not hold exactly the constants the "
                    f"manifest lists ('{text.shown(extra[0])}')"
                )
            constants = {name: z[key] for name, key in keys.items()}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise InputError(f"{folder}: weights.npz is not a plain numpy archive ({e})") from None
    for name, arr in constants.items():
        if arr.dtype.name not in ALL_DTYPES or arr.dtype.byteorder not in "=|":
            raise InputError(
                f"{folder}: weights.npz constant '{text.shown(name)}' has dtype {arr.dtype}, "
                "which orchestrate never writes"
            )
    for name in bf16:
        if constants[name].dtype != np.uint16:
            raise InputError(
                f"{folder}: weights.npz constant '{text.shown(name)}' is listed as bfloat16 "
                f"but holds {constants[name].dtype}, not uint16 bit patterns"
            )
        constants[name] = constants[name].view(BFLOAT16)
    return constants
