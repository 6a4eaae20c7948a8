"""Launch configurations: the tiles, warps and stages each template may use.

For each template, a small space of configurations, the template's default
first.  The rule keeps those whose working set fits the device
(``kernels/fit.py``) and takes the best under the target's rank: the
planner ranks by the cost model's predicted time (``cost/roofline.py``), so
the chosen configuration is the model's best, and the ranked list is the
order a tuner would measure them in.  When none fits, the set is no kernel.
Block sizes are powers of two covering the problem, clamped to the tiles
below: ``tl.dot`` needs at least 16 in every dimension.

The spaces:

* matmul and conv: the default 64 x 64 x 32 with 3, 2 or 1 stages, then
  (BLOCK_M, BLOCK_N, BLOCK_K) tiles from 16 x 32 to 128 x 128 (small tiles
  give a small problem more blocks; a deep BLOCK_K and more stages shorten
  the chain of dependent loads) with 2, 3 or 4 software-pipeline stages and
  4 warps (8 for tiles over 64 x 128); GROUP_M 8.
* attention, row reduce, pointwise and window: their own spaces, beside
  their rules (``templates/<name>/config.py``).

* matmul split-K: when the output tiles alone underfill the device (fewer
  blocks than SMs, batch included) each dot configuration also comes with
  SPLIT_K 2, 4 and 8 programs per tile, each walking its share of the K
  steps, while that share stays at least ``MIN_SPLIT_STEPS``; the cost model
  prices the better SM fill against the fp32 partials written and read back
  and the fix-up's latency, so the rank takes one only where it pays.  The
  generator (``templates/matmul/emit.py``) sums the partials in a fixed order in the
  tile's last program, which applies the epilogue once.

Not yet: persistent (stream-K) kernels, which need their own emission.

Each configuration also carries the block sizes used under Triton's
interpreter (no GPU): the interpreter's cost grows with the number of
programs and loop steps, not with the block size, so those are much larger.
Tests shrink the ``INTERPRET_*`` figures to force several blocks.

``num_warps`` 4 and ``num_stages`` 3 are Triton's defaults.
"""

from __future__ import annotations

import functools
import math

from orchestrate.kernels.spec import LaunchConfig, launch_config
from orchestrate.shapes.symint import SymInt

NUM_WARPS, NUM_STAGES = 4, 3
MIN_DOT = 16


# matmul: (BLOCK_M, BLOCK_N, BLOCK_K) tiles, GROUP_M rows of tiles per group;
# the default first, then the space the rank chooses from
MATMUL_TILE, GROUP_M = (64, 64, 32), 8
DOT_TILES = (
    (128, 128, 64),
    (128, 64, 64),
    (64, 128, 64),
    (64, 64, 64),
    (64, 64, 128),
    (64, 32, 64),
    (32, 64, 64),
    (32, 32, 64),
    (32, 32, 128),
    (16, 64, 128),
    (16, 32, 128),
)
# IEEE fp32 dots run as FMAs on CUDA cores: short K steps and at most 512
# FMAs a thread per step (kernels/fit.py refuses more: ptxas spills)
FMA_TILES = (
    (64, 64, 16),
    (64, 32, 32),
    (32, 64, 32),
    (32, 32, 32),
    (16, 64, 32),
)
DOT_STAGES = (2, 3, 4)
# matmul split-K: programs per output tile, and the fewest K steps each may get
SPLIT_KS, MIN_SPLIT_STEPS = (2, 4, 8), 2


def dot_warps(bm: int, bn: int) -> int:
    """8 warps for tiles of more than 64 x 128 (their fp32 accumulator
    would spill with 4), else 4."""
    return 8 if bm * bn > 64 * 128 else NUM_WARPS


MATMUL_INTERPRET_BLOCK = 256  # each dimension: one tile covers a small matrix whole
# integer / fp64 matmuls multiply (BLOCK_M, BLOCK_K, BLOCK_N) products in
# registers and sum over K: smaller tiles
SLOW_BLOCK_MN, SLOW_BLOCK_K = 32, 8
INTERPRET_SLOW_VOLUME = 1 << 20

# conv (implicit GEMM): output pixels x output channels x reduction; the dot tiles
CONV_INTERPRET_BLOCK_M, CONV_INTERPRET_BLOCK = 1024, 256


def _key(value):
    """``value`` as the cache tells problems apart: a dimension of a range
    (``SymInt``, equal to any with its formula) with its ranges and hint, so
    that a space computed for past 1..2048 does not serve past 1..64."""
    if isinstance(value, SymInt):
        symbols = value.symbols
        return ("sym", value.poly, tuple(sorted(symbols.ranges.items())), int(value))
    if isinstance(value, tuple):
        return tuple(_key(v) for v in value)
    return value


def space(fn):
    """A template's configuration space as an immutable tuple, computed once
    per problem (enumeration judges the same anchor many times)."""

    @functools.lru_cache(maxsize=4096)
    def cached(key, *args) -> tuple[LaunchConfig, ...]:
        return tuple(fn(*args))

    def space(*args) -> tuple[LaunchConfig, ...]:
        return cached(_key(args), *args)

    space.cache_clear = cached.cache_clear
    return functools.wraps(fn)(space)


def row_tiles(
    rows: int,
    length: int,
    looped: bool,
    *,
    loop_block: int,
    tile: int,
    interpret_tile: int,
    interpret_loop_block: int,
) -> tuple[dict[str, int], dict[str, int]]:
    """The (GPU, interpreter) blocks of a kernel over rows of ``length``: a
    looped row one per program in column blocks of ``loop_block``; a row held
    whole with as many rows per program as ``tile`` elements allow.  The
    interpreter's blocks are larger (``interpret_*``): fewer programs."""
    cols = next_pow2(length)
    if looped:
        gpu = {"BLOCK_ROWS": 1, "BLOCK_COLS": min(loop_block, cols)}
        fast_cols = min(interpret_loop_block, cols)
    else:
        gpu = {"BLOCK_ROWS": min(next_pow2(rows), max(1, tile // cols)), "BLOCK_COLS": cols}
        fast_cols = cols
    fast = {
        "BLOCK_ROWS": min(next_pow2(rows), max(1, interpret_tile // fast_cols)),
        "BLOCK_COLS": fast_cols,
    }
    return gpu, fast


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def clamp_pow2(n: int, lo: int, hi: int) -> int:
    """The power of two covering ``n``, clamped to [lo, hi]."""
    return max(lo, min(hi, next_pow2(n)))


def uses_dot(dtype: str) -> bool:
    """tl.dot for fp16, bf16 and fp32; a multiply-and-sum for fp64 and integers."""
    return dtype in ("float16", "bfloat16", "float32")


def _fewer_stages(first: LaunchConfig) -> list[LaunchConfig]:
    """``first``, then the same tiles with shallower software pipelines."""
    out = [first]
    for stages in range(first.num_stages - 1, 0, -1):
        out.append(
            LaunchConfig(first.blocks, first.num_warps, stages, first.interpret, first.precision)
        )
    return out


@space
def matmul(
    m: int, n: int, k: int, dtype: str, tf32: bool, batch: int = 1, sms: int = 0
) -> list[LaunchConfig]:
    """C[m, n] = A[m, k] @ B[k, n] in ``dtype``, ``batch`` times, on a device
    of ``sms`` SMs (0: no split-K)."""
    precision = _precision(dtype, tf32)
    if not uses_dot(dtype):
        gpu = {
            "BLOCK_M": clamp_pow2(m, 1, SLOW_BLOCK_MN),
            "BLOCK_N": clamp_pow2(n, 1, SLOW_BLOCK_MN),
            "BLOCK_K": clamp_pow2(k, 1, SLOW_BLOCK_K),
        }
        half = MATMUL_INTERPRET_BLOCK // 2
        bm, bn = clamp_pow2(m, 1, half), clamp_pow2(n, 1, half)
        fast = {
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "BLOCK_K": clamp_pow2(k, 1, max(1, INTERPRET_SLOW_VOLUME // (bm * bn))),
        }
        first = launch_config(
            {**gpu, "GROUP_M": GROUP_M},
            fast,
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
            precision=precision,
        )
        return _fewer_stages(first)
    hi = MATMUL_INTERPRET_BLOCK
    fast = {
        "BLOCK_M": clamp_pow2(m, MIN_DOT, hi),
        "BLOCK_N": clamp_pow2(n, MIN_DOT, hi),
        "BLOCK_K": clamp_pow2(k, MIN_DOT, hi),
    }
    space = _dot_space(
        (m, n, k),
        fast,
        precision,
        {"GROUP_M": GROUP_M},
        fma=dtype == "float32" and precision == "ieee",
    )
    return space + _split_k(space, m, n, k, batch, sms)


def _split_k(
    space: list[LaunchConfig], m: int, n: int, k: int, batch: int, sms: int
) -> list[LaunchConfig]:
    """Each configuration of ``space`` whose tiles underfill ``sms`` SMs
    again, with SPLIT_K programs per tile for every SPLIT_K that leaves each
    at least MIN_SPLIT_STEPS steps of K."""
    out = []
    for c in space:
        blocks = dict(c.blocks)
        tiles = math.ceil(m / blocks["BLOCK_M"]) * math.ceil(n / blocks["BLOCK_N"]) * batch
        steps = math.ceil(k / blocks["BLOCK_K"])
        for s in SPLIT_KS:
            if tiles < sms and steps >= MIN_SPLIT_STEPS * s:
                out.append(
                    LaunchConfig(
                        (*c.blocks, ("SPLIT_K", s)),
                        c.num_warps,
                        c.num_stages,
                        c.interpret,
                        c.precision,
                    )
                )
    return out


@space
def conv(gemm_m: int, gemm_n: int, gemm_k: int, dtype: str, tf32: bool) -> list[LaunchConfig]:
    """An implicit GEMM of [gemm_m pixels, gemm_k] @ [gemm_k, gemm_n channels]."""
    fast = {
        "BLOCK_M": clamp_pow2(gemm_m, MIN_DOT, CONV_INTERPRET_BLOCK_M),
        "BLOCK_N": clamp_pow2(gemm_n, MIN_DOT, CONV_INTERPRET_BLOCK),
        "BLOCK_K": clamp_pow2(gemm_k, MIN_DOT, CONV_INTERPRET_BLOCK),
    }
    precision = _precision(dtype, tf32)
    return _dot_space(
        (gemm_m, gemm_n, gemm_k),
        fast,
        precision,
        {"GROUP_M": GROUP_M},
        fma=dtype == "float32" and precision == "ieee",
    )


def _dot_space(
    mnk: tuple[int, int, int], fast: dict, precision: str, extra: dict, fma: bool = False
) -> list[LaunchConfig]:
    """The dot tiles x warps x stages, clamped to the problem, without repeats;
    the default (64 x 64 x 32, 4 warps, 3 stages, then fewer stages) first,
    and with ``fma`` (IEEE fp32 on CUDA cores) the FMA tiles too."""
    m, n, k = mnk
    default = (
        clamp_pow2(m, MIN_DOT, MATMUL_TILE[0]),
        clamp_pow2(n, MIN_DOT, MATMUL_TILE[1]),
        clamp_pow2(k, MIN_DOT, MATMUL_TILE[2]),
    )
    out = [(default, NUM_WARPS, stages) for stages in range(NUM_STAGES, 0, -1)]
    for bm, bn, bk in DOT_TILES + (FMA_TILES if fma else ()):
        tile = (clamp_pow2(m, MIN_DOT, bm), clamp_pow2(n, MIN_DOT, bn), clamp_pow2(k, MIN_DOT, bk))
        out += [(tile, dot_warps(*tile[:2]), stages) for stages in DOT_STAGES]
    return [
        launch_config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, **extra},
            fast,
            num_warps=warps,
            num_stages=stages,
            precision=precision,
        )
        for (bm, bn, bk), warps, stages in dict.fromkeys(out)
    ]


def _precision(dtype: str, tf32: bool) -> str:
    return "tf32" if tf32 and dtype == "float32" else "ieee"
