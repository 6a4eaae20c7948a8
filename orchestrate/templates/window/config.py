"""The window template's configuration: one block size of output elements."""

from __future__ import annotations

from orchestrate.kernels import config

# window (pooling): output elements per program
WINDOW_BLOCK, INTERPRET_WINDOW_BLOCK = 512, 1 << 14


@config.space
def window(numel: int) -> list[config.LaunchConfig]:
    block = min(WINDOW_BLOCK, config.next_pow2(numel))
    return [
        config.launch_config(
            {"BLOCK": block},
            {"BLOCK": min(INTERPRET_WINDOW_BLOCK, max(block, config.next_pow2(numel)))},
        )
    ]
