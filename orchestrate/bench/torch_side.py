"""PyTorch baselines: eager, ``torch.compile`` and ``torch.compile(mode="max-autotune")``.

The model is the ONNX model converted by onnx2torch, or a torch module the
caller supplies (the torch source of the examples).  Under ``--dtype fp16``
or ``bf16`` the module's floating parameters and float inputs are cast to
that dtype (``module.to(dtype)``: the model a user would deploy in half
precision; integer inputs stay).  Calls run under ``torch.inference_mode``.

onnx2torch imports torchvision at import time for two converters
(NonMaxSuppression, RoiAlign), and torchvision must never be installed here
(it pulls a CUDA build of torch).  Where it is missing, onnx2torch is
imported against a stand-in that raises on use, so those two ops are
reported as "converter cannot handle" and every other op converts.
"""

from __future__ import annotations

import copy
import sys
import time
import types
from collections.abc import Callable, Sequence

from orchestrate.bench.runtimes import (
    TORCH_COMPILE,
    TORCH_EAGER,
    TORCH_MAX_AUTOTUNE,
    Feeds,
    Ready,
    Unavailable,
)

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
MODES = {TORCH_EAGER: None, TORCH_COMPILE: "default", TORCH_MAX_AUTOTUNE: "max-autotune"}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def import_onnx2torch():
    """The onnx2torch module, importable without torchvision (see the module doc)."""
    try:
        import onnx2torch
        import torchvision  # noqa: F401 - when present, onnx2torch uses it

        return onnx2torch
    except ImportError:
        pass

    def needs_torchvision(*args, **kwargs):
        raise NotImplementedError("this op needs torchvision, which is not installed")

    tv, ops = types.ModuleType("torchvision"), types.ModuleType("torchvision.ops")
    ops.roi_align = ops.nms = ops.box_convert = needs_torchvision
    tv.ops = ops
    saved = {k: sys.modules.get(k) for k in ("torchvision", "torchvision.ops")}
    sys.modules.update({"torchvision": tv, "torchvision.ops": ops})
    try:
        import onnx2torch
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return onnx2torch


def from_onnx(model) -> tuple[object, str]:
    """(torch module, where it came from) for an ONNX model; raises
    ``Unconvertible`` with the converter's reason when it cannot."""
    try:
        onnx2torch = import_onnx2torch()
    except ImportError as e:
        raise Unconvertible(f"onnx2torch is not installed ({_first_line(e)})") from None
    try:
        return onnx2torch.convert(model), "onnx2torch"
    except Exception as e:  # noqa: BLE001 - the converter raises what it likes
        raise Unconvertible(f"converter cannot handle: {_first_line(e)}") from None


class Unconvertible(Exception):
    """onnx2torch cannot convert the model (the message says why)."""


def torch_runtimes(
    make_module: Callable[[], tuple[object, str]],
    input_names: Sequence[str],
    feed_sets: Sequence[Feeds],
    keys: Sequence[str],
    dtype: str | None,
    on_gpu: bool,
) -> Callable[[str], Ready | Unavailable]:
    """A function of a key in ``keys`` that makes that baseline ready.  The
    module is built once, on first use, and stays on the host; each
    baseline moves its own copy to the device, so every runtime's peak
    memory counts its weights (``run.measure`` brackets the making too)."""
    built: dict[str, object] = {}

    def module():
        if "module" not in built:
            try:
                built["module"] = make_module()
            except Unconvertible as e:
                built["module"] = e
        return built["module"]

    def make(key: str) -> Ready | Unavailable:
        started = time.perf_counter()
        got = module()
        if isinstance(got, Unconvertible):
            return Unavailable(key, str(got))
        mod, source = got
        import torch

        device = "cuda" if on_gpu else "cpu"
        cast = getattr(torch, TORCH_DTYPES.get(dtype or "fp32", "float32"))
        try:
            mod = copy.deepcopy(mod).eval().to(device)
            if dtype is not None:
                mod = mod.to(cast)
            staged = [
                [
                    _tensor(torch, feeds[n], device, cast if dtype is not None else None)
                    for n in input_names
                ]
                for feeds in feed_sets
            ]
            mode = MODES[key]
            fn = mod if mode is None else torch.compile(mod, mode=mode)

            def call(i: int):
                with torch.inference_mode():
                    return fn(*staged[i])

            call(0)  # compiles (torch.compile is lazy)
            if on_gpu:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any failure of the baseline is its reason
            return Unavailable(key, f"{key} failed on {source}'s model: {_first_line(e)}")
        note = f"model from {source}" + (f", cast to {cast}" if dtype is not None else "")
        return Ready(
            key,
            key.replace("torch-compile-", "torch.compile ").replace("-", " "),
            call,
            time.perf_counter() - started,
            note=note,
        )

    return make


def _tensor(torch, arr, device: str, cast):
    t = torch.from_numpy(arr).to(device)
    return t.to(cast) if cast is not None and t.is_floating_point() else t
