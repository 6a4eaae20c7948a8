"""Device functions generated modules may call, each emitted only when used.

Triton's interpreter has no libdevice, so tanh, round-half-even, pow and the
C-style integer division and remainder are written here with core ``tl`` ops:
the same source runs compiled on a GPU and interpreted on a CPU.  A
generator that calls one records it (``Body.use``); the module then defines
exactly the helpers its kernels call, and what those call in turn.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Helper:
    name: str
    source: str  # the @triton.jit function
    requires: tuple[Helper, ...] = ()


def helper(name: str, body: str, *requires: Helper) -> Helper:
    return Helper(name, f"@triton.jit\ndef {name}{body}", tuple(requires))


TANH = helper(
    "_tanh",
    """(x):
    # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|): no overflow
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)
""",
)

ROUND_HALF_EVEN = helper(
    "_round_half_even",
    """(x):
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)
""",
)

POW = helper(
    "_pow",
    """(x, y):
    # x ** y for real y; negative x only with integral y, as in C pow()
    y = y + tl.zeros_like(x)
    mag = tl.exp(y * tl.log(tl.abs(x)))
    integral = y == tl.floor(y)
    odd = integral & ((y - 2.0 * tl.floor(y * 0.5)) != 0.0)
    r = tl.where((x < 0) & odd, -mag, mag)
    r = tl.where((x < 0) & (~integral), float("nan"), r)
    return tl.where(y == 0.0, 1.0, r)
""",
)

IDIV = helper(
    "_idiv",
    """(a, b):
    # C division (truncates toward zero), whatever Triton's // does
    q = tl.abs(a) // tl.abs(b)
    return tl.where((a < 0) != (b < 0), -q, q)
""",
)

IMOD_TRUNC = helper(
    "_imod_trunc",
    """(a, b):
    return a - b * _idiv(a, b)
""",
    IDIV,
)

IMOD_FLOOR = helper(
    "_imod_floor",
    """(a, b):
    r = a - b * _idiv(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
""",
    IDIV,
)

FMOD = helper(
    "_fmod",
    """(a, b):
    q = a / b
    q = tl.where(q < 0, tl.ceil(q), tl.floor(q))
    return a - b * q
""",
)

PROD = helper(
    "_prod",
    """(a, b):
    return a * b
""",
)

HELPERS = (TANH, ROUND_HALF_EVEN, POW, IDIV, IMOD_TRUNC, IMOD_FLOOR, FMOD, PROD)
