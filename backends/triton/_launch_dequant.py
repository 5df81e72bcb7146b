"""Typed host wrapper of the dequant kernel: int4 experts into a 16-bit scratch.

The ``dequant`` path's first launch (``_fused.py``). May import core; triton only
inside functions.
"""

import torch

from backends.triton._configs import (
    DEQUANT_BLOCK_K,
    DEQUANT_BLOCK_R,
    DEQUANT_WARPS,
    ceil_div,
    next_pow2,
)
from backends.triton._launch import (
    ExpertMatrix,
    _operand_dtype,
    is_interpreting,
    ptx_target,
)


def dequantize_experts(
    b: ExpertMatrix,
    lo: int,
    hi: int,
    out: torch.Tensor,
    *,
    block_r: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    words: bool = False,
) -> None:
    """Write experts ``lo .. hi-1`` of int4 ``b`` into ``out`` ``(hi-lo, rows, cols)``.

    Tiles of ``block_r`` rows by ``block_k`` columns (powers of two; defaults
    ``DEQUANT_BLOCK_R``, ``DEQUANT_BLOCK_K``, ``DEQUANT_WARPS``), in the interpreter
    16 x 64; a tile spans several scale groups or lies in one. ``words=True`` reads
    whole int32 words, dequantized by inline PTX on a CUDA GPU where the scales have
    the output's 16-bit dtype, else in float32 as the byte form does; by default the
    byte form runs (on an H100 the word form tied it or lost, ``_configs.py``).
    """
    import triton.language as tl

    from backends.triton._kernels_dequant import _dequant_kernel

    assert b.scale is not None
    rows, cols = int(b.data.shape[1]), 2 * int(b.data.shape[2])
    group = b.group_size
    small = is_interpreting()
    block_r = block_r or (16 if small else DEQUANT_BLOCK_R)
    block_k = min(block_k or (64 if small else DEQUANT_BLOCK_K), next_pow2(cols))
    sub = block_k if group == cols else min(group, block_k)
    zero = b.zero_point if b.zero_point is not None else b.scale
    if words and not b.words_fit:
        msg = (
            "words=True needs int4 data readable as aligned int32 words "
            "(ExpertMatrix.words_fit)"
        )
        raise ValueError(msg)
    asm = (  # the word form's inline PTX: 16-bit output, scales of its dtype
        words
        and ptx_target(out)
        and out.dtype in (torch.bfloat16, torch.float16)
        and b.scale.dtype == out.dtype
    )
    col_tiles = ceil_div(cols, block_k)
    grid = (ceil_div((hi - lo) * rows, block_r) * col_tiles,)
    _dequant_kernel[grid](  # rows of experts lo..hi-1 flattened (contiguous views)
        b.data[lo:hi].contiguous(),
        b.scale[lo:hi].contiguous(),
        zero[lo:hi].contiguous(),
        out,
        (hi - lo) * rows,
        cols,
        b.data.shape[2],
        b.scale.shape[2],
        out.stride(1),
        col_tiles,
        GROUP=group,
        SUB=sub,
        HAS_ZP=b.zero_point is not None,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        WORDS=words,
        ASM=asm,
        CT=_operand_dtype(out.dtype) if asm else tl.float32,
        num_warps=num_warps or DEQUANT_WARPS,
    )
