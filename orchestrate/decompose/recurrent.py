"""Recurrent ONNX operators: RNN, GRU and LSTM, unrolled over a static sequence.

The input projection of every time step and direction is one matmul
(``X @ W^T + bias`` over all ``seq * batch`` rows at once); each step then adds the recurrent
matmul ``H @ R^T`` of its own slice and applies the cell's gates as
primitives, so the linear program fuses each cell like any other elementwise
chain.  Both directions of a bidirectional op are separate chains.

``sequence_lens`` masks a step out per batch row: a row whose length is at
most ``t`` keeps its state and writes zeros to ``Y``.  That is the spec's
reverse direction too (a row's reverse pass starts at its own last step),
because the masked steps at the end come first and leave the initial state
alone.

A sequence of more than :data:`MAX_STEPS` time steps is refused: each step
is a handful of primitives per direction, and the planner's graph grows with
them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate.decompose import elementwise
from orchestrate.decompose.builder import Builder, Value
from orchestrate.errors import GraphError, InputError, UnsupportedError

# the longest sequence unrolled (time steps of one direction)
MAX_STEPS = 128

# name -> (alphas, betas it takes, with their defaults); ONNX's optional
# activations and the three required ones, matched case-insensitively as
# onnxruntime does
_ACTIVATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "relu": ((), ()),
    "tanh": ((), ()),
    "sigmoid": ((), ()),
    "softsign": ((), ()),
    "softplus": ((), ()),
    "leakyrelu": ((0.01,), ()),
    "thresholdedrelu": ((1.0,), ()),
    "elu": ((1.0,), ()),
    "hardsigmoid": ((0.2,), (0.5,)),
    "affine": ((1.0,), (0.0,)),
    "scaledtanh": ((1.0,), (1.0,)),
}

Activation = Callable[[Builder, Value], Value]


def _activation(name: str, alpha: float | None, beta: float | None) -> Activation:
    key = name.lower()
    if key == "relu":
        return lambda b, x: b.relu(x)
    if key == "tanh":
        return lambda b, x: b.tanh(x)
    if key == "sigmoid":
        return lambda b, x: b.sigmoid(x)
    if key == "softsign":
        return elementwise.Softsign
    if key == "softplus":
        return elementwise.Softplus
    if key == "leakyrelu":
        return lambda b, x: elementwise.LeakyRelu(b, x, alpha=alpha)
    if key == "thresholdedrelu":
        return lambda b, x: elementwise.ThresholdedRelu(b, x, alpha=alpha)
    if key == "elu":
        return lambda b, x: elementwise.Elu(b, x, alpha=alpha)
    if key == "hardsigmoid":
        return lambda b, x: elementwise.HardSigmoid(b, x, alpha=alpha, beta=beta)
    if key == "affine":
        return lambda b, x: b.add(b.mul(x, alpha), beta)
    assert key == "scaledtanh", key
    return lambda b, x: b.mul(b.tanh(b.mul(x, beta)), alpha)


def activation_functions(
    op: str,
    names: Sequence[str] | None,
    alphas: Sequence[float] | None,
    betas: Sequence[float] | None,
    defaults: tuple[str, ...],
    directions: int,
) -> tuple[tuple[Activation, ...], ...]:
    """The activation functions of each direction.  ``alphas`` and ``betas``
    are consumed in order by the functions that take them; a function past
    the end of the list takes its default."""
    names = list(names) if names else list(defaults) * directions
    if len(names) == len(defaults) and directions == 2:
        names = names * 2
    if len(names) != len(defaults) * directions:
        raise GraphError(
            f"{op} takes {len(defaults) * directions} activations here, got {len(names)}"
        )
    a_left, b_left = list(alphas or ()), list(betas or ())
    made = []
    for name in names:
        if name.lower() not in _ACTIVATIONS:
            raise UnsupportedError(f"{op} activation {name!r}", {f"{op} activation {name}": 1})
        a_default, b_default = _ACTIVATIONS[name.lower()]
        alpha = a_left.pop(0) if a_default and a_left else (a_default or (None,))[0]
        beta = b_left.pop(0) if b_default and b_left else (b_default or (None,))[0]
        made.append(_activation(name, alpha, beta))
    n = len(defaults)
    return tuple(tuple(made[d * n : (d + 1) * n]) for d in range(directions))


@dataclass(frozen=True)
class Direction:
    """One direction's weights, as primitives' operands: ``w_t`` the input
    weight transposed ``[input, G*H]``, ``r_t`` the recurrent one
    ``[H, G*H]``, ``wb`` and ``rb`` the biases ``[G*H]`` (None: zero)."""

    w_t: Value
    r_t: Value
    wb: Value | None
    rb: Value | None
    f: tuple[Activation, ...]
    reverse: bool


@dataclass(frozen=True)
class Recurrence:
    """An op's inputs in time-major form and its attributes checked."""

    x: Value  # [seq, batch, input]
    directions: tuple[Direction, ...]
    hidden: int
    lengths: Value | None  # [batch, 1] int, None: every row runs every step
    clip: float | None
    layout: int

    @property
    def seq(self) -> int:
        return self.x.shape[0]

    @property
    def batch(self) -> int:
        return self.x.shape[1]


def recurrence(
    b: Builder,
    op: str,
    gates: int,
    x: Value,
    w: Value,
    r: Value,
    bias: Value | None,
    sequence_lens: Value | None,
    *,
    hidden_size: int | None,
    direction: str,
    layout: int,
    clip: float | None,
    f: tuple[tuple[Activation, ...], ...],
) -> Recurrence:
    if direction not in ("forward", "reverse", "bidirectional"):
        raise GraphError(f"{op} direction {direction!r} is not forward, reverse or bidirectional")
    if layout not in (0, 1):
        raise GraphError(f"{op} layout {layout} is not 0 or 1")
    dirs = 2 if direction == "bidirectional" else 1
    if x.rank != 3 or w.rank != 3 or r.rank != 3:
        raise GraphError(f"{op} takes X, W and R of rank 3, got {x.shape}, {w.shape}, {r.shape}")
    if layout == 1:
        x = b.transpose(x, (1, 0, 2))
    seq, _, n_in = x.shape
    hidden = r.shape[-1]
    if hidden_size is not None and hidden_size != hidden:
        raise GraphError(f"{op} hidden_size {hidden_size} but R is {r.shape}")
    want = {"W": (dirs, gates * hidden, n_in), "R": (dirs, gates * hidden, hidden)}
    for name, value in (("W", w), ("R", r)):
        if value.shape != want[name]:
            raise GraphError(f"{op} {name} is {value.shape}, expected {want[name]}")
    if bias is not None and bias.shape != (dirs, 2 * gates * hidden):
        raise GraphError(f"{op} B is {bias.shape}, expected {(dirs, 2 * gates * hidden)}")
    if seq > MAX_STEPS:
        raise UnsupportedError(
            f"{op} over {seq} time steps: recurrences are unrolled up to {MAX_STEPS}",
            {f"{op} steps": 1},
        )
    if sequence_lens is not None and sequence_lens.shape != (x.shape[1],):
        raise GraphError(f"{op} sequence_lens is {sequence_lens.shape}, expected {(x.shape[1],)}")
    if clip is not None and not clip > 0:
        raise GraphError(f"{op} clip {clip} is not positive")
    made = []
    for d in range(dirs):
        w_d = b.reshape(b.slice_axis(w, 0, d, d + 1), w.shape[1:])
        r_d = b.reshape(b.slice_axis(r, 0, d, d + 1), r.shape[1:])
        wb = rb = None
        if bias is not None:
            b_d = b.reshape(b.slice_axis(bias, 0, d, d + 1), bias.shape[1:])
            wb = b.slice_axis(b_d, 0, 0, gates * hidden)
            rb = b.slice_axis(b_d, 0, gates * hidden, 2 * gates * hidden)
        reverse = direction == "reverse" or d == 1
        made.append(
            Direction(b.transpose(w_d, (1, 0)), b.transpose(r_d, (1, 0)), wb, rb, f[d], reverse)
        )
    return Recurrence(x, tuple(made), hidden, _lengths(b, op, sequence_lens, seq), clip, layout)


def _lengths(b: Builder, op: str, sequence_lens: Value | None, seq: int) -> Value | None:
    """``sequence_lens`` as ``[batch, 1]``; None when every row runs every
    step.  A length given at run time outside ``[0, seq]`` acts as the
    nearest end (onnxruntime refuses it); a constant one is refused here."""
    if sequence_lens is None:
        return None
    if sequence_lens.is_const and not np.all(
        (sequence_lens.const >= 0) & (sequence_lens.const <= seq)
    ):
        raise InputError(f"{op} sequence_lens {sequence_lens.const.tolist()} outside [0, {seq}]")
    if sequence_lens.is_const and bool(np.all(sequence_lens.const == seq)):
        return None
    return b.reshape(sequence_lens, (sequence_lens.size, 1))


def initial(b: Builder, rec: Recurrence, state: Value | None, d: int, name: str) -> Value:
    """Direction ``d``'s initial state ``[batch, H]`` (zeros when omitted)."""
    shape = (rec.batch, rec.hidden)
    if state is None:
        return b.constant(np.zeros(shape, dtype=rec.x.dtype))
    dirs = len(rec.directions)
    want = (rec.batch, dirs, rec.hidden) if rec.layout == 1 else (dirs, *shape)
    if state.shape != want:
        raise GraphError(f"{name} is {state.shape}, expected {want}")
    if rec.layout == 1:
        state = b.transpose(state, (1, 0, 2))
    return b.reshape(b.slice_axis(state, 0, d, d + 1), shape)


def projections(b: Builder, rec: Recurrence, biases: Sequence[Value | None]) -> list[Value]:
    """``X @ W^T + bias`` for every step and direction at once, one matmul
    whose columns are the directions' side by side; each direction's
    ``[seq, batch, G*H]``."""
    seq, batch, n_in = rec.x.shape
    rows = b.matmul(
        b.reshape(rec.x, (seq * batch, n_in)), b.concat([dr.w_t for dr in rec.directions], 1)
    )
    width = rec.directions[0].w_t.shape[-1]
    if any(v is not None for v in biases):
        zero = np.zeros(width, dtype=rec.x.dtype)
        rows = b.add(rows, b.concat([b.constant(zero) if v is None else v for v in biases], 0))
    rows = b.reshape(rows, (seq, batch, rows.shape[-1]))
    return [b.slice_axis(rows, -1, d * width, (d + 1) * width) for d in range(len(biases))]


def step_input(b: Builder, xw: Value, t: int) -> Value:
    return b.reshape(b.slice_axis(xw, 0, t, t + 1), xw.shape[1:])


def gate(b: Builder, v: Value, k: int, hidden: int) -> Value:
    """The ``k``-th block of ``hidden`` columns of ``v``."""
    return b.slice_axis(v, -1, k * hidden, (k + 1) * hidden)


def clipped(b: Builder, rec: Recurrence, v: Value) -> Value:
    """``v`` bounded to ``[-clip, clip]``: the input of every activation."""
    return v if rec.clip is None else b.min(b.max(v, -rec.clip), rec.clip)


def masked(b: Builder, rec: Recurrence, t: int, new: Value, old: Value) -> tuple[Value, Value]:
    """(the state after step ``t``, the step's ``Y``): rows whose sequence
    ended keep ``old`` and write zeros (see :func:`_empty_rows_zero`)."""
    if rec.lengths is None:
        return new, new
    running = b.gt(rec.lengths, t)
    return b.where(running, new, old), b.where(running, new, 0)


def _empty_rows_zero(b: Builder, rec: Recurrence, state: Value) -> Value:
    """A row of length 0 ends in zeros, not in its initial state (as
    onnxruntime has it; the spec does not say)."""
    if rec.lengths is None or rec.lengths.is_const and bool(np.all(rec.lengths.const > 0)):
        return state
    return b.where(b.gt(rec.lengths, 0), state, 0)


def outputs(b: Builder, rec: Recurrence, ys: list[list[Value]], finals: list[list[Value]]):
    """``Y`` ``[seq, dirs, batch, H]`` and each final state ``[dirs, batch,
    H]`` (batch first under layout 1).  ``ys[d][t]`` is direction ``d``'s
    output at time ``t``; ``finals[d]`` its final states."""
    batch, hidden, dirs = rec.batch, rec.hidden, len(ys)
    pieces = [b.reshape(ys[d][t], (1, batch, hidden)) for t in range(rec.seq) for d in range(dirs)]
    y = b.reshape(b.concat(pieces, 0), (rec.seq, dirs, batch, hidden))
    states = [
        b.concat([b.reshape(finals[d][k], (1, batch, hidden)) for d in range(len(finals))], 0)
        for k in range(len(finals[0]))
    ]
    if rec.layout == 1:
        y = b.transpose(y, (2, 0, 1, 3))
        states = [b.transpose(s, (1, 0, 2)) for s in states]
    return (y, *states)


def unroll(
    b: Builder,
    rec: Recurrence,
    starts: Sequence[Sequence[Value]],
    step: Callable[[int, int, Value, tuple[Value, ...]], tuple[Value, ...]],
    xws: Sequence[Value],
):
    """Run ``step(t, d, x_t, states) -> states`` over time in each
    direction's order (``states[0]`` is H, the step's output); the outputs
    of :func:`outputs`."""
    ys, finals = [], []
    for d, dr in enumerate(rec.directions):
        states = tuple(starts[d])
        y_d: list[Value | None] = [None] * rec.seq
        order = range(rec.seq - 1, -1, -1) if dr.reverse else range(rec.seq)
        for t in order:
            new = step(t, d, step_input(b, xws[d], t), states)
            kept = [masked(b, rec, t, n, o) for n, o in zip(new, states)]
            states = tuple(k[0] for k in kept)
            y_d[t] = kept[0][1]
        ys.append(y_d)
        finals.append([_empty_rows_zero(b, rec, v) for v in states])
    return outputs(b, rec, ys, finals)


# -- the three ops -----------------------------------------------------------


def RNN(
    b: Builder,
    x: Value,
    w: Value,
    r: Value,
    bias: Value | None = None,
    sequence_lens: Value | None = None,
    initial_h: Value | None = None,
    *,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    layout: int = 0,
):
    """``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)``."""
    dirs = 2 if direction == "bidirectional" else 1
    f = activation_functions("RNN", activations, activation_alpha, activation_beta, ("Tanh",), dirs)
    rec = recurrence(
        b,
        "RNN",
        1,
        x,
        w,
        r,
        bias,
        sequence_lens,
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        clip=clip,
        f=f,
    )
    xws = projections(b, rec, [_both(b, dr.wb, dr.rb) for dr in rec.directions])

    def step(t, d, xt, states):
        (h,) = states
        dr = rec.directions[d]
        return (dr.f[0](b, clipped(b, rec, b.add(xt, b.matmul(h, dr.r_t)))),)

    starts = [[initial(b, rec, initial_h, d, "initial_h")] for d in range(dirs)]
    return unroll(b, rec, starts, step, xws)


def GRU(
    b: Builder,
    x: Value,
    w: Value,
    r: Value,
    bias: Value | None = None,
    sequence_lens: Value | None = None,
    initial_h: Value | None = None,
    *,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    layout: int = 0,
    linear_before_reset: int = 0,
):
    """Gates z, r, h: ``z = f(..)``, ``r = f(..)``, ``h = g(X Wh^T + (r * H)
    Rh^T + Rbh + Wbh)`` (with ``linear_before_reset``: ``r * (H Rh^T +
    Rbh)``), ``H_t = (1 - z) * h + z * H_{t-1}``."""
    dirs = 2 if direction == "bidirectional" else 1
    f = activation_functions(
        "GRU", activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh"), dirs
    )
    rec = recurrence(
        b,
        "GRU",
        3,
        x,
        w,
        r,
        bias,
        sequence_lens,
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        clip=clip,
        f=f,
    )
    hid = rec.hidden

    def input_bias(dr: Direction) -> Value | None:
        if dr.rb is None or not linear_before_reset:
            return _both(b, dr.wb, dr.rb)
        # Rbh stays inside the reset gate's product
        zr = b.slice_axis(dr.rb, 0, 0, 2 * hid)
        rb = b.concat([zr, b.constant(np.zeros(hid, dtype=zr.dtype))], 0)
        return _both(b, dr.wb, rb)

    xws = projections(b, rec, [input_bias(dr) for dr in rec.directions])

    def step(t, d, xt, states):
        (h,) = states
        dr = rec.directions[d]
        g_f, g_g = dr.f
        if linear_before_reset:
            hr = b.matmul(h, dr.r_t)
            z = g_f(b, clipped(b, rec, b.add(gate(b, xt, 0, hid), gate(b, hr, 0, hid))))
            rg = g_f(b, clipped(b, rec, b.add(gate(b, xt, 1, hid), gate(b, hr, 1, hid))))
            hh = gate(b, hr, 2, hid)
            if dr.rb is not None:
                hh = b.add(hh, gate(b, dr.rb, 2, hid))
            pre = b.add(gate(b, xt, 2, hid), b.mul(rg, hh))
        else:
            r_zr = b.slice_axis(dr.r_t, -1, 0, 2 * hid)
            hr = b.matmul(h, r_zr)
            z = g_f(b, clipped(b, rec, b.add(gate(b, xt, 0, hid), gate(b, hr, 0, hid))))
            rg = g_f(b, clipped(b, rec, b.add(gate(b, xt, 1, hid), gate(b, hr, 1, hid))))
            pre = b.add(gate(b, xt, 2, hid), b.matmul(b.mul(rg, h), gate(b, dr.r_t, 2, hid)))
        cand = g_g(b, clipped(b, rec, pre))
        return (b.add(b.mul(b.sub(1, z), cand), b.mul(z, h)),)

    starts = [[initial(b, rec, initial_h, d, "initial_h")] for d in range(dirs)]
    return unroll(b, rec, starts, step, xws)


def LSTM(
    b: Builder,
    x: Value,
    w: Value,
    r: Value,
    bias: Value | None = None,
    sequence_lens: Value | None = None,
    initial_h: Value | None = None,
    initial_c: Value | None = None,
    peepholes: Value | None = None,
    *,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    input_forget: int = 0,
    layout: int = 0,
):
    """Gates i, o, f, c: ``C_t = f * C_{t-1} + i * g(c)``, ``H_t = o *
    h(C_t)``, with peepholes ``P`` (i, o, f) on the cell state; with
    ``input_forget`` the forget gate is ``1 - i``."""
    dirs = 2 if direction == "bidirectional" else 1
    f = activation_functions(
        "LSTM", activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh", "Tanh"), dirs
    )
    rec = recurrence(
        b,
        "LSTM",
        4,
        x,
        w,
        r,
        bias,
        sequence_lens,
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        clip=clip,
        f=f,
    )
    hid = rec.hidden
    if peepholes is not None and peepholes.shape != (dirs, 3 * hid):
        raise GraphError(f"LSTM P is {peepholes.shape}, expected {(dirs, 3 * hid)}")
    peep = [
        None if peepholes is None else b.reshape(b.slice_axis(peepholes, 0, d, d + 1), (3 * hid,))
        for d in range(dirs)
    ]
    xws = projections(b, rec, [_both(b, dr.wb, dr.rb) for dr in rec.directions])

    def step(t, d, xt, states):
        h, c = states
        dr, p = rec.directions[d], peep[d]
        g_f, g_g, g_h = dr.f
        pre = b.add(xt, b.matmul(h, dr.r_t))

        def gate_of(k: int, peep_k: int | None, cell: Value) -> Value:
            v = gate(b, pre, k, hid)
            if p is not None and peep_k is not None:
                v = b.add(v, b.mul(gate(b, p, peep_k, hid), cell))
            return v

        i = g_f(b, clipped(b, rec, gate_of(0, 0, c)))
        fg = b.sub(1, i) if input_forget else g_f(b, clipped(b, rec, gate_of(2, 2, c)))
        cand = g_g(b, clipped(b, rec, gate_of(3, None, c)))
        c_new = b.add(b.mul(fg, c), b.mul(i, cand))
        o = g_f(b, clipped(b, rec, gate_of(1, 1, c_new)))
        return (b.mul(o, g_h(b, c_new)), c_new)

    starts = [
        [initial(b, rec, initial_h, d, "initial_h"), initial(b, rec, initial_c, d, "initial_c")]
        for d in range(dirs)
    ]
    return unroll(b, rec, starts, step, xws)


def _both(b: Builder, x: Value | None, y: Value | None) -> Value | None:
    if x is None or y is None:
        return x if y is None else y
    return b.add(x, y)


OPS = {"RNN": RNN, "GRU": GRU, "LSTM": LSTM}
