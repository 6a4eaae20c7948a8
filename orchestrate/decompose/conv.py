"""Convolution and pooling ONNX operators: Conv, ConvTranspose and the pools.

Every window op ends in one CONV or POOL primitive over explicitly padded
input.  What the primitives do not know is arranged around them:

* ``auto_pad`` becomes explicit pads, and a negative pad (SAME with a stride
  larger than the kernel) becomes a SLICE that crops the input;
* ``ceil_mode`` becomes extra end padding (POOL max pads with -inf, avg
  with zeros);
* the divisor of an average that is not the kernel volume (``ceil_mode``
  windows, ``count_include_pad=0``) becomes a MUL by a constant correction
  tensor (kernel volume / real count per output position) computed here;
* ConvTranspose with stride s is s**n stride-1 CONVs, one per output
  phase (sub-pixel convolution): the outputs at positions ``s*q + phi``
  take only the kernel taps ``k`` whose ``k*d`` meets ``phi + pad`` modulo
  ``s``, so each phase is an ordinary convolution of the input with those
  taps (flipped, in/out-swapped, dilated by ``d / gcd(s, d)``), and the
  phases are interleaved back by layout (CONCAT, RESHAPE, SLICE: index
  arithmetic in the kernel that reads them).  No zero is inserted and no
  multiply-add is spent on one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate.decompose.builder import Builder, Value
from orchestrate.errors import UnsupportedError

# -- window geometry ----------------------------------------------------------


def _spatial(x: Value, what: str) -> int:
    n = x.rank - 2
    if n < 1:
        raise UnsupportedError(f"{what}: input of rank {x.rank} has no spatial axes", {what: 1})
    return n


def _ints(values, n: int, default: int, name: str, what: str) -> tuple[int, ...]:
    if values is None:
        return (default,) * n
    out = tuple(int(v) for v in values)
    if len(out) != n:
        raise UnsupportedError(
            f"{what}: {name} {list(out)} does not match {n} spatial axes", {f"{what}.{name}": 1}
        )
    return out


def _explicit_pads(
    auto_pad: str, sizes, kernel, strides, dilations, pads, what: str
) -> tuple[list[int], list[int]]:
    """(begins, ends) per spatial axis.

    SAME pads to ``ceil(size / stride)`` outputs; a negative total (stride
    larger than the kernel) is no padding, as in TensorFlow and the ONNX
    reference (onnxruntime's results there depend on its kernel).
    """
    n = len(sizes)
    if auto_pad == "NOTSET":
        p = _ints(pads, 2 * n, 0, "pads", what)
        if min(p, default=0) < 0:
            raise UnsupportedError(f"{what}: negative pads {list(p)}", {f"{what}.pads": 1})
        return list(p[:n]), list(p[n:])
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedError(f"{what}: auto_pad={auto_pad!r}", {f"{what}.auto_pad": 1})
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        half = (total + 1) // 2 if auto_pad == "SAME_LOWER" else total // 2
        begins.append(half)
        ends.append(total - half)
    return begins, ends


def _crop(b: Builder, x: Value, begins: list[int], ends: list[int]):
    """Slice away negative pads; return (x, non-negative begins, ends)."""
    if min(begins + ends) >= 0:
        return x, begins, ends
    starts = [0, 0] + [max(0, -p) for p in begins]
    shape = list(x.shape[:2]) + [
        d - max(0, -p) - max(0, -q) for d, p, q in zip(x.shape[2:], begins, ends)
    ]
    if min(shape) < 1:
        raise UnsupportedError(f"{b.origin}: padding crops the whole input", {"negative pads": 1})
    x = b.slice(x, starts, [1] * x.rank, shape)
    return x, [max(0, p) for p in begins], [max(0, q) for q in ends]


def _check_window(sizes, begins, ends, kernel, dilations, what: str) -> None:
    for size, p, q, k, d in zip(sizes, begins, ends, kernel, dilations):
        if size + p + q < (k - 1) * d + 1:
            raise UnsupportedError(
                f"{what}: kernel {list(kernel)} is larger than the padded input", {what: 1}
            )


# -- convolution --------------------------------------------------------------


def _add_bias(b: Builder, y: Value, bias: Value | None) -> Value:
    if bias is None:
        return y
    if bias.shape != (y.shape[1],):
        raise UnsupportedError(f"bias of shape {bias.shape} for {y.shape[1]} channels", {"B": 1})
    return b.add(y, b.reshape(bias, (1, y.shape[1]) + (1,) * (y.rank - 2)))


def _kernel(w: Value, kernel_shape, op: str) -> tuple[int, ...]:
    """The weight's spatial shape, which a kernel_shape attribute must repeat."""
    kernel = tuple(w.shape[2:])
    if kernel_shape is not None and tuple(kernel_shape) != kernel:
        raise UnsupportedError(
            f"{op}: kernel_shape {list(kernel_shape)} differs from weight {w.shape}",
            {f"{op}.kernel_shape": 1},
        )
    return kernel


def Conv(
    b: Builder,
    x: Value,
    w: Value,
    bias: Value | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations=None,
    group: int = 1,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> Value:
    n = _spatial(x, "Conv")
    kernel = _kernel(w, kernel_shape, "Conv")
    if group < 1 or x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise UnsupportedError(
            f"Conv: input {x.shape} and weight {w.shape} do not fit group={group}", {"W": 1}
        )
    strides = _ints(strides, n, 1, "strides", "Conv")
    dilations = _ints(dilations, n, 1, "dilations", "Conv")
    begins, ends = _explicit_pads(auto_pad, x.shape[2:], kernel, strides, dilations, pads, "Conv")
    _check_window(x.shape[2:], begins, ends, kernel, dilations, "Conv")
    y = b.conv(x, w, strides=strides, pads=begins + ends, dilations=dilations, group=group)
    return _add_bias(b, y, bias)


def _transpose_pads(
    auto_pad: str, sizes, kernel, strides, dilations, adj, pads, output_shape
) -> tuple[list[int], list[int], list[int]]:
    """ConvTranspose (begins, ends, output sizes), as onnxruntime computes them."""
    n = len(sizes)
    full = [
        (i - 1) * s + a + (k - 1) * d + 1
        for i, s, a, k, d in zip(sizes, strides, adj, kernel, dilations)
    ]
    if output_shape is not None:
        out = [int(v) for v in output_shape][-n:]
        if len(out) != n:
            raise UnsupportedError(
                f"ConvTranspose: output_shape {list(output_shape)}",
                {"ConvTranspose.output_shape": 1},
            )
    elif auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = _explicit_pads(
            "VALID" if auto_pad == "VALID" else "NOTSET",
            sizes,
            kernel,
            strides,
            dilations,
            pads,
            "ConvTranspose",
        )
        return begins, ends, [f - p - q for f, p, q in zip(full, begins, ends)]
    else:
        out = [i * s for i, s in zip(sizes, strides)]
    # pads that reach `out`; none when `out` is larger (zeros at the end then)
    total = [max(0, f - o) for f, o in zip(full, out)]
    if output_shape is None:
        out = [f - t for f, t in zip(full, total)]
    # the odd pad goes to the end for SAME_UPPER, to the start otherwise
    if auto_pad == "SAME_UPPER":
        begins = [t // 2 for t in total]
    else:
        begins = [t - t // 2 for t in total]
    return begins, [t - p for t, p in zip(total, begins)], out


def _conv_layout(b: Builder, w: Value, group: int) -> Value:
    """ConvTranspose weight (C, M/g, k...) as a Conv weight (M, C/g, k...)."""
    c, mg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    n = len(kernel)
    w = b.reshape(w, (group, c // group, mg) + kernel)
    w = b.transpose(w, (0, 2, 1) + tuple(range(3, 3 + n)))
    return b.reshape(w, (group * mg, c // group) + kernel)


@dataclass(frozen=True)
class _Phase:
    """The outputs ``s*q + phi`` (q < ``length``) of one spatial axis: the
    kernel taps they take (``first``, then every ``step``-th, ``count`` of
    them), read as a stride-1 convolution of the input from index
    ``offset`` (at q = 0, its first tap) at dilation ``dilation``."""

    length: int
    first: int
    step: int
    count: int
    offset: int
    dilation: int


def _phase(phi: int, k: int, s: int, d: int, begin: int, out: int) -> _Phase:
    """Output phase ``phi`` of one axis: y[s*q + phi] is the sum over the
    taps t with (phi + begin - t*d) % s == 0 of x[q + (phi + begin - t*d) // s] * w[t]."""
    length = max(0, -(-(out - phi) // s))
    taps = [t for t in range(k) if (phi + begin - t * d) % s == 0]
    if not taps or not length:
        return _Phase(length, 0, 1, 0, 0, 1)
    # a correlation reads the kernel flipped: its first tap is the last one,
    # which reads the smallest input index
    offset = (phi + begin - taps[-1] * d) // s
    return _Phase(length, taps[0], s // math.gcd(s, d), len(taps), offset, d // math.gcd(s, d))


def _phase_conv(
    b: Builder, x: Value, w: Value, phases: Sequence[_Phase], group: int, m: int
) -> Value:
    """The convolution of one output phase (a ``_Phase`` per axis):
    [N, M, length...], zeros where an axis takes no tap."""
    n = len(phases)
    shape = x.shape[:1] + (m,) + tuple(p.length for p in phases)
    if any(p.count == 0 for p in phases):
        zero = b.reshape(b.constant(np.zeros((), x.dtype)), (1,) * len(shape))
        return b.expand(zero, shape)
    taps = b.slice(
        w,
        [0, 0] + [p.first + (p.count - 1) * p.step for p in phases],
        [1, 1] + [-p.step for p in phases],
        list(w.shape[:2]) + [p.count for p in phases],
    )
    front = [-p.offset for p in phases]
    back = [
        p.length - 1 + p.offset + (p.count - 1) * p.dilation - (size - 1)
        for p, size in zip(phases, x.shape[2:])
    ]
    xs, front, back = _crop(b, x, front, back)
    return b.conv(
        xs,
        _conv_layout(b, taps, group),
        strides=(1,) * n,
        pads=front + back,
        dilations=[p.dilation for p in phases],
        group=group,
    )


def _interleave(b: Builder, ys: dict, strides: Sequence[int], out: Sequence[int]) -> Value:
    """The phases' outputs (by phase tuple) as one [N, M, out...]:
    y[.., s*q + phi, ..] = ys[phi][.., q, ..], each padded to ``ceil(out / s)``."""
    n = len(strides)
    q = [-(-o // s) for o, s in zip(out, strides)]
    lead = next(iter(ys.values())).shape[:2]

    def gathered(prefix: tuple[int, ...]) -> Value:
        axis = len(prefix)
        if axis == n:
            y = ys[prefix]
            ends = [qa - d for qa, d in zip(q, y.shape[2:])]
            y = b.pad(y, [0] * (2 + n) + [0, 0] + ends)
            return b.reshape(y, lead + tuple(v for qa in q for v in (qa, 1)))
        parts = [gathered(prefix + (phi,)) for phi in range(strides[axis])]
        return b.concat(parts, 2 + 2 * axis + 1)

    y = b.reshape(gathered(()), lead + tuple(qa * s for qa, s in zip(q, strides)))
    return b.slice(y, [0] * (2 + n), [1] * (2 + n), lead + tuple(out))


def ConvTranspose(
    b: Builder,
    x: Value,
    w: Value,
    bias: Value | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations=None,
    group: int = 1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
) -> Value:
    n = _spatial(x, "ConvTranspose")
    kernel = _kernel(w, kernel_shape, "ConvTranspose")
    if x.shape[1] != w.shape[0]:
        raise UnsupportedError(
            f"ConvTranspose: input {x.shape} and weight {w.shape} do not match", {"W": 1}
        )
    strides = _ints(strides, n, 1, "strides", "ConvTranspose")
    dilations = _ints(dilations, n, 1, "dilations", "ConvTranspose")
    adj = _ints(output_padding, n, 0, "output_padding", "ConvTranspose")
    begins, _, out = _transpose_pads(
        auto_pad, x.shape[2:], kernel, strides, dilations, adj, pads, output_shape
    )
    if min(out) < 1:
        raise UnsupportedError(f"ConvTranspose: output size {out}", {"ConvTranspose.pads": 1})
    if group < 1 or w.shape[0] % group:
        raise UnsupportedError(
            f"ConvTranspose: {w.shape[0]} channels in {group} groups", {"group": 1}
        )
    m = w.shape[1] * group
    per_axis = [
        [_phase(phi, k, s, d, p, o) for phi in range(s)]
        for k, s, d, p, o in zip(kernel, strides, dilations, begins, out)
    ]
    ys = {
        phi: _phase_conv(b, x, w, [per_axis[a][f] for a, f in enumerate(phi)], group, m)
        for phi in itertools.product(*(range(s) for s in strides))
    }
    y = ys[(0,) * n] if all(s == 1 for s in strides) else _interleave(b, ys, strides, out)
    return _add_bias(b, y, bias)


# -- pooling ------------------------------------------------------------------


class _Window:
    """The geometry of one pooling node after auto_pad and ceil_mode."""

    def __init__(self, x, what, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
        n = _spatial(x, what)
        if kernel_shape is None:
            raise UnsupportedError(f"{what}: kernel_shape is required", {f"{what}.kernel_shape": 1})
        self.kernel = _ints(kernel_shape, n, 1, "kernel_shape", what)
        self.strides = _ints(strides, n, 1, "strides", what)
        self.dilations = _ints(dilations, n, 1, "dilations", what)
        self.begins, self.ends = _explicit_pads(
            auto_pad, x.shape[2:], self.kernel, self.strides, self.dilations, pads, what
        )
        self.sizes = x.shape[2:]
        _check_window(self.sizes, self.begins, self.ends, self.kernel, self.dilations, what)
        # ceil_mode: the last window may run past the end padding, as long as
        # it starts inside the input or the front padding
        self.extra = []
        self.out = []
        for size, p, q, k, s, d in zip(
            self.sizes, self.begins, self.ends, self.kernel, self.strides, self.dilations
        ):
            span = size + p + q - ((k - 1) * d + 1)
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= size + p:
                o -= 1
            self.out.append(o)
            self.extra.append(max(0, (o - 1) * s + (k - 1) * d + 1 - (size + p + q)))

    @property
    def pads(self) -> list[int]:
        return self.begins + [q + e for q, e in zip(self.ends, self.extra)]

    def pool(self, b: Builder, x: Value, kind: str) -> Value:
        pads = self.pads
        n = len(self.kernel)
        if any(p >= k for p, k in zip(pads, self.kernel * 2)):
            # ONNX pools (what the primitive exports to) want pads < kernel:
            # pad with the pool's neutral value first
            fill = float("-inf") if kind == "max" else 0.0
            x = b.pad(x, [0, 0] + pads[:n] + [0, 0] + pads[n:], value=fill)
            pads = [0] * (2 * n)
        return b.pool(
            x, kind, kernel=self.kernel, strides=self.strides, pads=pads, dilations=self.dilations
        )

    def counts(self, lo_pad: bool) -> np.ndarray | None:
        """Taps per output position inside the input (and, with ``lo_pad``, inside
        the explicit pads); None where that is the kernel volume everywhere."""
        per_axis = []
        for size, p, q, k, s, d, o in zip(
            self.sizes, self.begins, self.ends, self.kernel, self.strides, self.dilations, self.out
        ):
            lo, hi = (-p, size + q) if lo_pad else (0, size)
            taps = np.arange(o)[:, None] * s - p + np.arange(k)[None, :] * d
            per_axis.append(((taps >= lo) & (taps < hi)).sum(axis=1))
        total = per_axis[0]
        for c in per_axis[1:]:
            total = np.multiply.outer(total, c)
        if np.all(total == math.prod(self.kernel)):
            return None
        if np.any(total == 0):
            raise UnsupportedError("pool window that covers only padding", {"pool pads": 1})
        return total


def MaxPool(
    b: Builder,
    x: Value,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    storage_order: int = 0,
    strides=None,
) -> Value:
    # storage_order only shapes the Indices output, which is not supported
    win = _Window(x, "MaxPool", kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    if x.dtype in ("int8", "uint8"):  # exact in float32
        return b.cast(win.pool(b, b.cast(x, "float32"), "max"), x.dtype)
    return win.pool(b, x, "max")


def AveragePool(
    b: Builder,
    x: Value,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> Value:
    win = _Window(x, "AveragePool", kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    y = win.pool(b, x, "avg")
    counts = win.counts(lo_pad=bool(count_include_pad))
    if counts is None:
        return y
    fix = (math.prod(win.kernel) / counts).astype(x.dtype)
    return b.mul(y, b.constant(fix.reshape((1, 1) + fix.shape)))


def _abs_pow(b: Builder, x: Value, p: float) -> Value:
    if p == 1:
        return b.abs(x)
    if p == 2:
        return b.mul(x, x)
    return b.pow(b.abs(x), p)


def _root(b: Builder, x: Value, p: float) -> Value:
    if p == 1:
        return x
    if p == 2:
        return b.sqrt(x)
    return b.pow(x, 1.0 / p)


def _lp_p(p, what: str) -> float:
    p = float(p)
    if not p > 0:
        raise UnsupportedError(f"{what}: p={p}", {f"{what}.p": 1})
    return p


def LpPool(
    b: Builder,
    x: Value,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations=None,
    kernel_shape=None,
    p: float = 2,
    pads=None,
    strides=None,
) -> Value:
    p = _lp_p(p, "LpPool")
    win = _Window(x, "LpPool", kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    total = b.mul(win.pool(b, _abs_pow(b, x, p), "avg"), math.prod(win.kernel))
    return _root(b, total, p)


def GlobalAveragePool(b: Builder, x: Value) -> Value:
    return b.mean(x, range(2, x.rank)) if x.rank > 2 else b.identity(x)


def GlobalMaxPool(b: Builder, x: Value) -> Value:
    return b.reduce_max(x, range(2, x.rank)) if x.rank > 2 else b.identity(x)


def GlobalLpPool(b: Builder, x: Value, *, p: float = 2) -> Value:
    p = _lp_p(p, "GlobalLpPool")
    return _root(b, b.sum(_abs_pow(b, x, p), range(2, x.rank)), p)


OPS = {
    "Conv": Conv,
    "ConvTranspose": ConvTranspose,
    "MaxPool": MaxPool,
    "AveragePool": AveragePool,
    "LpPool": LpPool,
    "GlobalAveragePool": GlobalAveragePool,
    "GlobalMaxPool": GlobalMaxPool,
    "GlobalLpPool": GlobalLpPool,
}
