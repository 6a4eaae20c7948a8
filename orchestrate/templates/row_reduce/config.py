"""The row-reduce template's configuration: one (its time is bandwidth: the
block only needs enough bytes in flight); a row longer than
``SINGLE_PASS_ROW`` is reduced in a loop over column blocks, one pass per
phase."""

from __future__ import annotations

from orchestrate.kernels import config

# row reduce: a row longer than SINGLE_PASS_ROW is reduced in a loop over
# column blocks (one pass per phase) instead of being held in registers
SINGLE_PASS_ROW = 16384
SINGLE_PASS_TILE = 4096  # elements per program (several short rows per program)
LOOP_BLOCK = 2048  # columns per loop step
INTERPRET_TILE, INTERPRET_LOOP_BLOCK = 1 << 16, 1 << 14
WIDE_ROW = 2**31  # from here column indices need 64 bits


# a looped row whose result is all the kernel writes may be split over
# SPLIT_K programs (each its share of the column blocks, the last of them
# combining the partial results): up to this many
MAX_SPLIT = 256


@config.space
def row_reduce(
    rows: int, length: int, looped: bool, splittable: bool = False
) -> list[config.LaunchConfig]:
    """The configurations of a row reduce: one, or for a row that may be
    split (``splittable``, see ``rule.py``) one per SPLIT_K, 1 first (the
    cost model ranks them: a few long rows fill the GPU only split).  A row
    of 2**31 elements or more is always split, its columns in int64."""
    gpu, fast = config.row_tiles(
        rows,
        length,
        looped,
        loop_block=LOOP_BLOCK,
        tile=SINGLE_PASS_TILE,
        interpret_tile=INTERPRET_TILE,
        interpret_loop_block=INTERPRET_LOOP_BLOCK,
    )
    if looped and splittable:
        fast = {**fast, "BLOCK_ROWS": 1}  # one row's share per program
        steps = -(-length // gpu["BLOCK_COLS"])
        splits = [s for s in (1 << i for i in range(9)) if s <= min(MAX_SPLIT, steps)]
        if length >= WIDE_ROW:
            splits = [s for s in splits if s > 1] or [2]
        return [config.launch_config({**gpu, "SPLIT_K": s}, {**fast, "SPLIT_K": s}) for s in splits]
    return [config.launch_config(gpu, fast)]
