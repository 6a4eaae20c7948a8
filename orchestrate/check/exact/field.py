"""Modular arithmetic for the exact check: values in Z_p x Z_q, q | p - 1.

``draw`` picks a random prime q in [2^24, 2^25), then a prime p = k*q + 1
below 2^31, and a random element w of order q in Z_p^* (g^((p-1)/q) for a
random g, redrawn while it is 1).  exp(x) is w^(x mod q): since w^q = 1,
exp(a + b) = exp(a) * exp(b) exactly, the one identity of exp that
rearranged kernels rely on.

Arrays are numpy uint64 holding residues < p < 2^31, so the product of two
fits in 64 bits before the ``%``: exact, vectorised, and fast enough for a
small transformer in a second (Python ints in object arrays would be exact
too, but matmul over them is a pure-Python loop, 100x slower).  A matmul
splits its right operand into 16-bit halves, so a dot product of up to 2^17
terms (< 2^31 * 2^16 each) still fits in 64 bits.

Floats become field elements exactly: a finite float is a dyadic rational
m * 2^e, mapped to m * (2^e mod p), the image of that rational under the
ring map from Z[1/2] to Z_p.  Both sides use this one map, so an identity of
real arithmetic over the constants is an identity in the field.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

U64 = np.uint64
Q_BITS = 24  # q in [2^24, 2^25)
P_LIMIT = 2**31
MAX_DOT = 2**17  # the longest dot product matmul keeps exact


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (these bases suffice)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for s in small:
        if n % s == 0:
            return n == s
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class Field:
    """The moduli and the root of unity of one trial."""

    p: int
    q: int
    w: int  # of order q in Z_p^*

    def __post_init__(self) -> None:
        assert (self.p - 1) % self.q == 0 and self.p < P_LIMIT
        assert self.w != 1 and pow(self.w, self.q, self.p) == 1

    def exp(self, xq: np.ndarray) -> np.ndarray:
        """w^x mod p for residues x mod q (square and multiply, vectorised)."""
        out = np.ones(xq.shape, U64)
        base = np.full(xq.shape, self.w, U64)
        e = xq.astype(U64, copy=True)
        while e.any():
            odd = (e & U64(1)).astype(bool)
            out[odd] = out[odd] * base[odd] % U64(self.p)
            base = base * base % U64(self.p)
            e >>= U64(1)
        return out


def draw(rng: random.Random) -> Field:
    """Fresh primes q | p - 1 and a q-th root of unity w, from ``rng``."""
    while True:
        q = rng.randrange(2**Q_BITS, 2 ** (Q_BITS + 1)) | 1
        if not is_prime(q):
            continue
        for _ in range(200):
            k = 2 * rng.randrange(1, (P_LIMIT - 1) // q // 2)
            p = k * q + 1
            if is_prime(p):
                break
        else:
            continue
        while True:
            w = pow(rng.randrange(2, p - 1), (p - 1) // q, p)
            if w != 1:
                return Field(p, q, w)


def mulmod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    return a * b % U64(m)


def matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """a @ b mod m for residues < 2^31 (broadcast batch dimensions)."""
    if a.shape[-1] > MAX_DOT:
        raise ValueError(f"a dot product of {a.shape[-1]} terms does not fit in 64 bits")
    lo, hi = b & U64(0xFFFF), b >> U64(16)
    high = np.matmul(a, hi) % U64(m)
    return (high * U64(1 << 16) + np.matmul(a, lo) % U64(m)) % U64(m)


def inverse(a: np.ndarray, m: int) -> np.ndarray:
    """Elementwise inverse mod prime m (a^(m-2)); 0 stays 0 (callers check)."""
    out = np.ones(a.shape, U64)
    base = a.astype(U64, copy=True) % U64(m)
    e = m - 2
    while e:
        if e & 1:
            out = out * base % U64(m)
        base = base * base % U64(m)
        e >>= 1
    return out


def residues(arr: np.ndarray, m: int, special: dict[str, int]) -> np.ndarray:
    """The image of a numeric array in Z_m: integers and booleans by value,
    finite floats as dyadic rationals (see the module docstring); +inf, -inf
    and NaN as the elements ``special`` holds for them (random per trial,
    the same on both sides)."""
    arr = np.asarray(arr)
    if arr.dtype.kind in "biu":
        wide = arr.astype(object if arr.dtype.kind == "u" else np.int64).reshape(-1)
        return np.asarray(np.mod(wide, m), dtype=U64).reshape(arr.shape)
    x = arr.astype(np.float64).reshape(-1)
    finite = np.isfinite(x)
    mant, exp = np.frexp(np.where(finite, x, 0.0))
    whole = (mant * 2.0**53).astype(np.int64)  # exact: x = whole * 2^(exp - 53)
    shift = exp.astype(np.int64) - 53
    out = np.mod(whole, m).astype(U64)
    for s in np.unique(shift):
        scale = pow(2, int(s), m)  # Python's pow takes negative exponents mod a prime
        sel = shift == s
        out[sel] = out[sel] * U64(scale) % U64(m)
    for name, test in (("+inf", np.isposinf), ("-inf", np.isneginf), ("nan", np.isnan)):
        out[test(x)] = U64(special[name] % m)
    return out.reshape(arr.shape)
