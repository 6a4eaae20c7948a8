"""The attention template's configurations: query rows x keys per step
from 128 x 128 down to 16 x 16 (the default 64 x 64 first), 4 or 8 warps,
3, 2 or 1 stages; where the blocks of query rows underfill the device
(decoding: a few query rows, many keys), each also with split-KV: SPLIT_K 2,
4 or 8 programs per block of rows, each walking its share of the keys into
an fp32 partial state (running max, sum and output), which the block's last
program combines (``emit.py``); the cost model prices the fuller device
against the partials' bytes and the combine's latency."""

from __future__ import annotations

import math

from orchestrate.kernels import config

# attention: query rows x keys per step; head dims padded to a power of two
ATTENTION_TILE = (64, 64)
ATTENTION_INTERPRET_BLOCK = 128


@config.space
def attention(
    lq: int, lk: int, d: int, dv: int, batch: int = 1, sms: int = 0
) -> list[config.LaunchConfig]:
    """Query tiles of BLOCK_M rows, key steps of BLOCK_N: the default 64 x 64
    first, down to 16 x 16 (large head dims need small tiles), then up to
    128 x 128; each with 4 then 8 warps and 3, 2, then 1 stages.  Then, on a
    device of ``sms`` SMs (0: none), split-KV for ``batch`` entries whose
    query tiles underfill it (``_split_kv``)."""
    heads = {
        "BLOCK_D": max(config.MIN_DOT, config.next_pow2(d)),
        "BLOCK_DV": max(config.MIN_DOT, config.next_pow2(dv)),
    }
    fast = {
        "BLOCK_M": config.clamp_pow2(lq, config.MIN_DOT, ATTENTION_INTERPRET_BLOCK),
        "BLOCK_N": config.clamp_pow2(lk, config.MIN_DOT, ATTENTION_INTERPRET_BLOCK),
    }
    bm, bn = ATTENTION_TILE
    tiles = [
        (bm, bn),
        (bm, bn // 2),
        (bm // 2, bn),
        (bm // 2, bn // 2),
        (bm // 2, bn // 4),
        (bm // 4, bn // 4),
        (2 * bm, bn),
        (2 * bm, 2 * bn),
        (2 * bm, bn // 2),
        (bm, 2 * bn),
    ]
    out = []
    for m, n in tiles:
        for warps in (config.NUM_WARPS, 2 * config.NUM_WARPS):
            for stages in range(config.NUM_STAGES, 0, -1):
                gpu = {
                    "BLOCK_M": config.clamp_pow2(lq, config.MIN_DOT, m),
                    "BLOCK_N": config.clamp_pow2(lk, config.MIN_DOT, n),
                    **heads,
                }
                c = config.launch_config(gpu, fast, num_warps=warps, num_stages=stages)
                if c not in out:
                    out.append(c)
    return out + _split_kv(out, lq, lk, dv, batch, sms)


def _split_kv(
    space: list[config.LaunchConfig], lq: int, lk: int, dv: int, batch: int, sms: int
) -> list[config.LaunchConfig]:
    """Split-KV (flash-decoding): each configuration of ``space`` whose
    blocks of query rows underfill ``sms`` SMs again, with SPLIT_K 2, 4 or 8
    programs per block of rows, each walking its share of the key blocks,
    while that share stays at least ``config.MIN_SPLIT_STEPS`` and the fp32
    partial states keep int32 offsets."""
    out = []
    for c in space:
        blocks = dict(c.blocks)
        tiles = math.ceil(lq / blocks["BLOCK_M"]) * batch
        steps = math.ceil(lk / blocks["BLOCK_N"])
        for s in config.SPLIT_KS:
            if (
                tiles < sms
                and steps >= config.MIN_SPLIT_STEPS * s
                and s * batch * lq * (dv + 2) < 2**31
            ):
                out.append(
                    config.LaunchConfig(
                        (*c.blocks, ("SPLIT_K", s)),
                        c.num_warps,
                        c.num_stages,
                        c.interpret,
                        c.precision,
                    )
                )
    return out
