"""What `orchestrate bench` times: an ONNX model (optimized here, into a
temporary bundle) or a bundle already made (with the model it was made from)."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrate.errors import InputError


@dataclass
class Target:
    name: str
    bundle: object  # orchestrate.api.Bundle
    model: object  # onnx.ModelProto
    graph: object  # its primitive graph at the bundle's shapes
    optimize_s: float | None
    verified: bool | None
    verify_note: str
    tmp: Path | None = None

    def close(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def resolve(
    path: Path,
    model: Path | None,
    shapes,
    *,
    dtype: str | None,
    device: str | None,
    trials: int = 1,
    time_limit: float | None = None,
) -> Target:
    """A ``Target`` for ``path``: a .onnx file is optimized (at ``dtype``, for
    ``device``) and verified over ``trials``; a bundle folder needs ``model``."""
    from orchestrate import api

    if path.is_dir():
        if model is None:
            raise InputError(
                f"{path}: a bundle; give --model MODEL.onnx, the model it was made "
                "from, for the baselines to run"
            )
        bundle, onnx_model, graph = api.bundle_and_model(
            path, model, shapes or None, _shape_option="--shape"
        )
        _check_made_from(path, bundle.manifest, model)
        made = bundle.plan.options.dtype
        if dtype is not None and dtype != made:
            raise InputError(
                f"--dtype {dtype}: {path} was optimized at {made or 'the model precision'}; "
                "optimize it again at that precision, or bench the .onnx"
            )
        return Target(
            path.name.removesuffix(".orch"),
            bundle,
            onnx_model,
            graph,
            None,
            None,
            "not checked by bench (orchestrate verify checks a bundle)",
        )
    if not path.exists():
        raise InputError(f"{path}: no such file or bundle folder")
    if model is not None:
        raise InputError(f"--model {model}: only for a bundle; {path} is the model itself")
    tmp = Path(tempfile.mkdtemp(prefix="orchestrate-bench-"))
    out = tmp / f"{path.stem}.orch"
    try:
        options = {"dtype": dtype, "device": device}
        if time_limit is not None:
            options["time_limit"] = time_limit
        started = time.perf_counter()
        result = api.optimize(path, out, shapes=shapes or None, trials=trials, **options)
        optimize_s = time.perf_counter() - started
        bundle, onnx_model, graph = api.bundle_and_model(
            out, path, shapes or None, _shape_option="--shape"
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report = result.report
    if report is None:
        verified, note = None, "not verified (trials 0)"
    elif report.simulated:
        verified, note = None, f"simulated in numpy, not run: {report.simulated}"
    else:
        verified, note = report.ok, f"{trials} random trial(s) against the float64 reference"
    return Target(path.stem, bundle, onnx_model, graph, optimize_s, verified, note, tmp)


def _check_made_from(path: Path, manifest: dict, model: Path) -> None:
    """InputError unless ``model`` is the file the bundle ``path`` was made
    from (the manifest's sha256): another model of the same interface (an
    Add made a Sub) would give timings of nothing."""
    from orchestrate import bundle, text

    made = manifest.get("model", {})
    if made.get("sha256") != bundle.sha256(model):
        raise InputError(
            f"--model {model}: not the model {path} was made from "
            f"({text.shown(str(made.get('file', '?')))}, by its sha256); pass that model, "
            "or bench this one (orchestrate bench MODEL.onnx)"
        )
