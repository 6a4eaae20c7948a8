"""The pointwise template's configuration: one block size (its time is
bandwidth: the block only needs enough bytes in flight)."""

from __future__ import annotations

from orchestrate.kernels import config

# pointwise: output elements per program
POINTWISE_BLOCK, INTERPRET_POINTWISE_BLOCK = 1024, 1 << 16


@config.space
def pointwise(numel: int) -> list[config.LaunchConfig]:
    return [
        config.launch_config(
            {"BLOCK": min(POINTWISE_BLOCK, config.next_pow2(numel))},
            {"BLOCK": min(INTERPRET_POINTWISE_BLOCK, config.next_pow2(numel))},
        )
    ]
