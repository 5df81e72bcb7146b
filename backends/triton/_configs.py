"""Tile configurations of the fused-MoE GEMMs, per shape class, and how they were chosen.

Imports only stdlib and attrs. Tuned on one NVIDIA H200 (torch 2.11, triton 3.6); see
bench/TUNING.md for what was measured (the sweep ran on an earlier dequant variant, so
this is the initial table, validated by bench/RESULTS.md). ``INTERPRETER`` keeps CPU
tests small and fast.
"""

from typing import Final

import attrs

NUM_SMS_H200: Final = 132


@attrs.frozen(kw_only=True)
class GemmTiles:
    """Tiles of one grouped GEMM.

    Attributes:
        block_n: output columns per program.
        block_k: reduction elements per step.
        split_k: programs sharing one output tile along the reduction (w2 only).
        num_warps: warps per program.
        num_stages: software-pipeline depth.
        dequant: int4 dequantization of the GEMM kernel: 0 int-to-float instructions,
            1 codes by bit pattern then scaled in the operand dtype, 2 the dot on the
            biased codes with zero point and scale applied after it (needs a step
            inside one group; otherwise 1 runs).
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    dequant: int = 2


@attrs.frozen(kw_only=True)
class MoETiles:
    """Row-block size shared by both GEMMs, and each GEMM's tiles."""

    block_m: int
    w13: GemmTiles
    w2: GemmTiles


INTERPRETER: Final = MoETiles(
    block_m=16,
    w13=GemmTiles(block_n=32, block_k=64),
    w2=GemmTiles(block_n=32, block_k=32, split_k=2),
)
"""CPU interpreter: small tiles; split-K 2 so its reduction path is tested too."""


GEMV: Final = GemmTiles(block_n=32, block_k=256, num_warps=4, num_stages=3)
"""Decode GEMV (``_moe_gemv_kernel``) on the GPU: 128 contiguous bytes per row per step.
A first choice, measured only against the GEMM path (bench/RESULTS.md, decode section)."""
GEMV_BY_DEFAULT: Final = False
"""Whether ``auto`` takes the decode GEMV. Off until it is measured on a GPU: it was
written and checked in the interpreter after this session's GPU time was spent, so
``fused_moe(..., path="gemv")`` is opt-in; bench/bench_decode.py and
tests/backends/test_triton_gemv_cuda.py are ready for that run (issue #3)."""
GEMV_INTERPRETER: Final = GemmTiles(block_n=16, block_k=64)
"""Decode GEMV in the CPU interpreter: small tiles, several steps and groups per step."""


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def split_for(tiles_out: int, k: int, block_k: int) -> int:
    """Split K until about two waves of programs fill the GPU (decode only)."""
    split = 1
    while tiles_out * split < 2 * NUM_SMS_H200 and k // (split * 2) >= 4 * block_k:
        split *= 2
    return min(split, 8)


def choose_tiles(
    *, num_pairs: int, num_experts: int, hidden_size: int, intermediate_size: int
) -> MoETiles:
    """Tiles for one forward; pure over the (host-known) sizes.

    The row block is sized from the expected pairs per expert, so that at decode sizes
    each busy expert gets one block and its weights are read once.
    """
    per_expert = -(-num_pairs // num_experts)
    busy = min(num_experts, num_pairs)
    if per_expert <= 64:
        block_m = min(64, max(16, _next_pow2(per_expert)))
        w2_out = busy * -(-hidden_size // 64)
        return MoETiles(
            block_m=block_m,
            w13=GemmTiles(block_n=64, block_k=128, num_warps=4, num_stages=4),
            w2=GemmTiles(
                block_n=64,
                block_k=128,
                split_k=split_for(w2_out, intermediate_size, 128),
                num_warps=4,
                num_stages=4,
            ),
        )
    block_m = 64 if per_expert <= 256 else 128
    tiles = GemmTiles(block_n=128, block_k=64, num_warps=8 if block_m == 128 else 4)
    return MoETiles(block_m=block_m, w13=tiles, w2=tiles)
