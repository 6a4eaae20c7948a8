"""Resize and Upsample as gathers and constant-weight blends.

Resize is computed once, here, in numpy: for each resized axis the source
indices and weights of every output position, so the graph only gathers along
that axis with a constant index tensor and blends with constant weights
(nearest: one gather; linear: two; cubic: four).  Those fuse like any other
gather and elementwise chain.  Coordinates follow onnxruntime's float32 order
of operations, so rounding near .5 agrees with it.
"""

from __future__ import annotations

import numpy as np

from orchestrate import ir
from orchestrate.decompose.builder import Builder, Value
from orchestrate.decompose.layout import _axes, _floats, _invalid
from orchestrate.errors import UnsupportedError

# -- Resize ----------------------------------------------------------------------

_COORDINATE_MODES = frozenset(
    {
        "half_pixel",
        "half_pixel_symmetric",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
        "tf_crop_and_resize",
        "tf_half_pixel_for_nn",
    }
)
_NEAREST_MODES = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})


def Resize(
    b: Builder,
    x: Value,
    roi: Value | None = None,
    scales: Value | None = None,
    sizes: Value | None = None,
    *,
    mode: str = "nearest",
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    nearest_mode: str = "round_prefer_floor",
    antialias: int = 0,
    axes=None,
    keep_aspect_ratio_policy: str = "stretch",
) -> Value:
    if b.opset < 11:  # Resize-10 is (X, scales) with Upsample's semantics
        return _resize_v10(b, x, roi, mode, "Resize")
    ctm = coordinate_transformation_mode
    if antialias:
        raise UnsupportedError("Resize antialias=1", {"Resize antialias": 1})
    if mode not in ("nearest", "linear", "cubic"):
        raise UnsupportedError(f"Resize mode={mode!r}", {f"Resize mode {mode}": 1})
    if ctm not in _COORDINATE_MODES:
        raise UnsupportedError(
            f"Resize coordinate_transformation_mode={ctm!r}", {f"Resize {ctm}": 1}
        )
    if nearest_mode not in _NEAREST_MODES:
        raise UnsupportedError(
            f"Resize nearest_mode={nearest_mode!r}", {f"Resize nearest_mode {nearest_mode}": 1}
        )
    if mode != "nearest" and x.dtype not in ir.FLOATS:
        raise UnsupportedError(f"Resize {mode} on {x.dtype}", {f"Resize {mode} {x.dtype}": 1})
    r = x.rank
    axes = list(range(r)) if axes is None else _axes(axes, r, "Resize")
    n = len(axes)
    scale_list = _present(scales, "Resize", "scales")
    size_list = _present(sizes, "Resize", "sizes")
    if (scale_list is None) == (size_list is None):
        raise _invalid("Resize", "exactly one of 'scales' and 'sizes' must be given")
    if size_list is not None:
        out = [int(s) for s in size_list]
        if len(out) != n or min(out, default=1) < 0:
            raise _invalid("Resize", f"sizes {out} do not fit axes {axes}")
        factor = [o / x.shape[a] if x.shape[a] else 1.0 for o, a in zip(out, axes)]
        if keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            s = pick(factor)
            factor = [s] * n
            out = [int(s * x.shape[a] + 0.5) for a in axes]
        elif keep_aspect_ratio_policy != "stretch":
            raise UnsupportedError(
                f"Resize keep_aspect_ratio_policy={keep_aspect_ratio_policy!r}",
                {"Resize keep_aspect_ratio_policy": 1},
            )
    else:
        factor = [float(np.float32(s)) for s in scale_list]
        if len(factor) != n or min(factor, default=1.0) <= 0:
            raise _invalid("Resize", f"scales {factor} do not fit axes {axes}")
        # floor(in * scale) in float32, as ONNX shape inference and onnxruntime do
        out = [int(np.floor(np.float32(x.shape[a]) * np.float32(s))) for a, s in zip(axes, factor)]
    box = [(0.0, 1.0)] * n
    if ctm == "tf_crop_and_resize":
        if roi is None:
            raise _invalid("Resize", "tf_crop_and_resize needs 'roi'")
        rois = _floats(roi, "Resize", "roi")
        if len(rois) != 2 * n:
            raise _invalid("Resize", f"roi {rois} does not fit axes {axes}")
        box = list(zip(rois[:n], rois[n:]))
    stretched = size_list is not None and keep_aspect_ratio_policy == "stretch"
    for a, o, s, (lo, hi) in zip(axes, out, factor, box):
        width = o if stretched else s * x.shape[a]  # the output length before flooring
        if _disputed(ctm, mode, o, width):
            raise UnsupportedError(
                f"Resize {ctm} {mode} to length {o} from the fractional length {width:g}: "
                "the ONNX reference and onnxruntime disagree here",
                {f"Resize {ctm} fractional length": 1},
            )
        taps = resize_taps(
            x.shape[a],
            o,
            s,
            mode=mode,
            coordinate_mode=ctm,
            nearest_mode=nearest_mode,
            cubic_a=cubic_coeff_a,
            exclude_outside=bool(exclude_outside),
            roi=(lo, hi),
        )
        x = _resample(b, x, a, *taps, extrapolation_value)
    return x


def _disputed(ctm: str, mode: str, out_len: int, width: float) -> bool:
    """Whether the ONNX reference implementation (which uses the fractional
    output width ``scale * length``) and onnxruntime and the spec text (which
    use the integer output length) give different source coordinates."""
    if ctm == "align_corners":
        return out_len > 1 and width != out_len
    if ctm == "tf_crop_and_resize":
        return width != out_len
    if ctm == "pytorch_half_pixel":  # the reference also maps length 1 to -0.5, not 0
        return out_len == 1 and (width != 1 or mode == "cubic")
    return False


def Upsample(b: Builder, x: Value, scales=None, *, mode: str = "nearest") -> Value:
    return _resize_v10(b, x, scales, mode, "Upsample")


def _present(v: Value | None, op: str, what: str) -> list[float] | None:
    """The values of an optional input; an empty tensor counts as absent."""
    if v is None:
        return None
    vals = _floats(v, op, what)
    return vals or None


def _resize_v10(b: Builder, x: Value, scales, mode: str, op: str) -> Value:
    """Upsample-7/9 and Resize-10: asymmetric coordinates; nearest rounds down
    when upsampling and up when downsampling (onnxruntime's rule)."""
    if scales is None:
        raise _invalid(op, "no scales")
    mode = "linear" if mode == "bilinear" else mode
    if mode not in ("nearest", "linear"):
        raise UnsupportedError(f"{op} mode={mode!r}", {f"{op} mode {mode}": 1})
    if mode == "linear" and x.dtype not in ir.FLOATS:
        raise UnsupportedError(f"{op} linear on {x.dtype}", {f"{op} linear {x.dtype}": 1})
    factor = [float(np.float32(s)) for s in _floats(scales, op, "scales")]
    if len(factor) != x.rank or min(factor, default=1.0) <= 0:
        raise _invalid(op, f"scales {factor} do not fit rank {x.rank}")
    for a, s in enumerate(factor):
        o = int(np.floor(np.float32(x.shape[a]) * np.float32(s)))
        rounding = "ceil" if s < 1 else "floor"
        taps = resize_taps(
            x.shape[a], o, s, mode=mode, coordinate_mode="asymmetric", nearest_mode=rounding
        )
        x = _resample(b, x, a, *taps, 0.0)
    return x


def resize_taps(
    in_len: int,
    out_len: int,
    scale: float,
    *,
    mode: str,
    coordinate_mode: str,
    nearest_mode: str = "round_prefer_floor",
    cubic_a: float = -0.75,
    exclude_outside: bool = False,
    roi: tuple[float, float] = (0.0, 1.0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Source indices and weights of every output position along one axis.

    Returns ``(index, weight, outside)``: ``index`` and ``weight`` are
    (out_len, taps) arrays (taps: nearest 1, linear 2, cubic 4) with indices
    clamped into the input (the spec's edge padding); ``outside`` marks the
    outputs that tf_crop_and_resize fills with the extrapolation value.
    """
    x, outside = _source_coordinate(out_len, in_len, scale, coordinate_mode, roi)
    base = np.floor(x)
    t = x - base  # in [0, 1): the position between base and base + 1
    if mode == "nearest":
        up = {
            "round_prefer_floor": t > 0.5,
            "round_prefer_ceil": t >= 0.5,
            "floor": np.zeros_like(t, bool),
            "ceil": t > 0,
        }[nearest_mode]
        index, weight = (base + up)[:, None], np.ones((out_len, 1))
    elif mode == "linear":
        index = base[:, None] + np.array([0, 1])
        weight = np.stack([1 - t, t], axis=1)
    else:  # cubic: Keys' kernel over base-1 .. base+2
        index = base[:, None] + np.array([-1, 0, 1, 2])
        weight = np.stack(
            [
                _keys(t + 1, cubic_a),
                _keys(t, cubic_a),
                _keys(1 - t, cubic_a),
                _keys(2 - t, cubic_a),
            ],
            axis=1,
        )
        if exclude_outside:
            weight = np.where((index < 0) | (index >= in_len), 0.0, weight)
            total = weight.sum(axis=1, keepdims=True)
            weight = weight / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, max(in_len - 1, 0)).astype(np.int64)
    return index, weight, outside


def _keys(s: np.ndarray, a: float) -> np.ndarray:
    """The cubic convolution kernel at distance ``s`` in [0, 2]."""
    return np.where(
        s <= 1,
        ((a + 2) * s - (a + 3)) * s * s + 1,
        ((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
    )


def _source_coordinate(out_len: int, in_len: int, scale: float, mode: str, roi):
    """x_original of every output coordinate (the spec's formulas).

    Computed in float32 in onnxruntime's order of operations: a coordinate
    that lands within rounding of an integer (or of .5) then rounds to the
    same source pixel as there.
    """
    f = np.float32
    y = np.arange(out_len, dtype=f)
    s, n, m, half = f(scale), f(in_len), f(out_len), f(0.5)
    outside = None
    if mode == "half_pixel":
        x = (y + half) / s - half
    elif mode == "half_pixel_symmetric":
        offset = n / f(2) * (f(1) - m / (s * n))
        x = (np.float64(offset) + (y + 0.5) / np.float64(s) - 0.5).astype(f)
    elif mode == "pytorch_half_pixel":
        x = (y + half) / s - half if out_len > 1 else np.zeros_like(y)
    elif mode == "align_corners":
        x = y * (n - f(1)) / (m - f(1)) if out_len > 1 else np.zeros_like(y)
    elif mode == "asymmetric":
        x = y / s
    elif mode == "tf_half_pixel_for_nn":
        x = (y + half) / s
    else:  # tf_crop_and_resize
        lo, hi = f(roi[0]), f(roi[1])
        if out_len > 1:
            x = lo * (n - f(1)) + y * (hi - lo) * (n - f(1)) / (m - f(1))
        else:
            x = np.full_like(y, 0.5 * (float(lo) + float(hi)) * (in_len - 1))
        outside = (x < 0) | (x > n - f(1))
    return x.astype(np.float64), outside


def _resample(b: Builder, x: Value, axis: int, index, weight, outside, fill) -> Value:
    """``sum_t gather(x, index[:, t], axis) * weight[:, t]`` (+ extrapolation)."""
    in_len, out_len = x.shape[axis], index.shape[0]
    if in_len == 0 or out_len == 0:
        if out_len:
            raise _invalid("Resize", f"cannot resize an empty axis to {out_len}")
        return b.slice_axis(x, axis, 0, 0)
    if outside is not None and not outside.any():
        outside = None
    taps = [t for t in range(index.shape[1]) if weight[:, t].any()]
    if out_len == in_len and outside is None and len(taps) == 1:
        t = taps[0]
        if np.array_equal(index[:, t], np.arange(in_len)) and np.all(weight[:, t] == 1):
            return x
    shape = [1] * x.rank
    shape[axis] = out_len
    out = None
    for t in taps:
        g = b.gather(x, b.constant(index[:, t]), axis)
        if not np.all(weight[:, t] == 1):
            g = b.mul(g, b.constant(weight[:, t].reshape(shape).astype(x.dtype)))
        out = g if out is None else b.add(out, g)
    if out is None:  # every weight is zero (exclude_outside far outside the input)
        out = b.expand(b.scalar(0, x), [out_len if i == axis else d for i, d in enumerate(x.shape)])
    if outside is not None:
        out = b.where(b.constant(outside.reshape(shape)), b.scalar(fill, out), out)
    return out


OPS = {"Resize": Resize, "Upsample": Upsample}
