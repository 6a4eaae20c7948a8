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


@config.space
def row_reduce(rows: int, length: int, looped: bool) -> list[config.LaunchConfig]:
    cols = config.next_pow2(length)
    if looped:
        gpu = {"BLOCK_ROWS": 1, "BLOCK_COLS": min(LOOP_BLOCK, cols)}
        fast_cols = min(INTERPRET_LOOP_BLOCK, cols)
    else:
        gpu = {
            "BLOCK_ROWS": min(config.next_pow2(rows), max(1, SINGLE_PASS_TILE // cols)),
            "BLOCK_COLS": cols,
        }
        fast_cols = cols
    fast = {
        "BLOCK_ROWS": min(config.next_pow2(rows), max(1, INTERPRET_TILE // fast_cols)),
        "BLOCK_COLS": fast_cols,
    }
    return [config.launch_config(gpu, fast)]
