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
    gpu, fast = config.row_tiles(
        rows,
        length,
        looped,
        loop_block=LOOP_BLOCK,
        tile=SINGLE_PASS_TILE,
        interpret_tile=INTERPRET_TILE,
        interpret_loop_block=INTERPRET_LOOP_BLOCK,
    )
    return [config.launch_config(gpu, fast)]
