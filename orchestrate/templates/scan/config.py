"""The scan template's configuration: one.  A row of at most
``SINGLE_PASS_ROW`` is scanned in one block (several short rows per
program); a longer one in column blocks of ``LOOP_BLOCK``, its running sum
carried from block to block."""

from __future__ import annotations

from orchestrate.kernels import config

SINGLE_PASS_ROW = 4096
SINGLE_PASS_TILE = 4096  # elements per program
LOOP_BLOCK = 1024
INTERPRET_TILE, INTERPRET_LOOP_BLOCK = 1 << 16, 1 << 14


@config.space
def scan(rows: int, length: int, looped: bool) -> list[config.LaunchConfig]:
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
