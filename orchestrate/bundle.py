"""The bundle `orchestrate optimize` writes, and loading it back.

    OUT/
      plan.json      the plan (kernels in order, costs, baselines, solver)
      kernels.py     the generated Triton source, one kernel per plan kernel
      weights.npz    constants the kernels read (loaded with allow_pickle=False)
      report.md      the explain table, baselines and verification result
      manifest.json  format, versions, constant names, sha256 of every file

The folder is written under a temporary name next to OUT and renamed into
place only when complete, so a failure leaves nothing at OUT.  ``load``
checks every hash in the manifest and refuses a bundle that was changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from orchestrate.errors import InputError, check_format
from orchestrate.plan import Plan

BUNDLE_FORMAT = "orchestrate-bundle/2"
# what each earlier format lacks, for the message that refuses it
_OLDER = {"orchestrate-bundle/1": "one jitted function per distinct kernel spec"}
FILES = ("plan.json", "kernels.py", "weights.npz", "report.md")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_destination(out: Path) -> None:
    """OUT may be new, or an earlier bundle (replaced); never another folder."""
    if out.exists():
        if not out.is_dir():
            raise InputError(f"{out}: exists and is not a folder")
        if any(out.iterdir()) and not (out / "manifest.json").is_file():
            raise InputError(
                f"{out}: folder exists and is not an orchestrate bundle; refusing to replace it"
            )
    if not out.parent.is_dir():
        raise InputError(f"{out}: folder {out.parent} does not exist")


class Staging:
    """A temporary folder next to OUT that becomes OUT on ``commit``."""

    def __init__(self, out: Path):
        check_destination(out)
        self.out = out
        self.path = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))

    def write(self, plan: Plan, kernels_py: str, constants: Mapping[str, np.ndarray],
              report: str, info: dict) -> None:  # fmt: skip
        keys = {name: f"c{i}" for i, name in enumerate(sorted(constants))}
        (self.path / "plan.json").write_text(json.dumps(plan.to_json(), indent=1) + "\n")
        (self.path / "kernels.py").write_text(kernels_py)
        with open(self.path / "weights.npz", "wb") as f:
            np.savez(f, **{keys[k]: np.ascontiguousarray(v) for k, v in constants.items()})
        (self.path / "report.md").write_text(report)
        manifest = {
            "format": BUNDLE_FORMAT,
            **info,
            "constants": keys,
            "files": {name: sha256(self.path / name) for name in FILES},
        }
        (self.path / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    def commit(self) -> Path:
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.old-{os.getpid()}"
            os.rename(self.out, old)
        os.rename(self.path, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def read(folder: str | os.PathLike) -> tuple[Plan, Path, dict[str, np.ndarray], dict]:
    """(plan, kernels.py path, constants, manifest) of a checked bundle."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such bundle folder")
    mpath = folder / "manifest.json"
    if not mpath.is_file():
        raise InputError(f"{folder}: not an orchestrate bundle (manifest.json is missing)")
    try:
        manifest = json.loads(mpath.read_text())
    except ValueError as e:
        raise InputError(f"{folder}: manifest.json is not valid JSON ({e})") from None
    check_format(manifest.get("format"), BUNDLE_FORMAT, _OLDER, str(folder), "bundle",
                 "run `orchestrate optimize` on the model again")  # fmt: skip
    for name in FILES:
        path = folder / name
        want = manifest.get("files", {}).get(name)
        if want is None:
            raise InputError(f"{folder}: manifest.json does not list {name}")
        if not path.is_file():
            raise InputError(f"{folder}: {name} is missing")
        if sha256(path) != want:
            raise InputError(f"{folder}: {name} was modified (sha256 does not match the manifest)")
    plan = Plan.from_json(json.loads((folder / "plan.json").read_text()), f"{folder}/plan.json")
    keys = manifest.get("constants", {})
    with np.load(folder / "weights.npz", allow_pickle=False) as z:
        constants = {name: z[key] for name, key in keys.items()}
    return plan, folder / "kernels.py", constants, manifest
