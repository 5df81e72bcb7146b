"""Triton kernel that dequantizes int4 experts to 16 bits (``@triton.jit`` only).

Used by triton-w4a16 at prefill sizes: a chunk of experts is dequantized into a
scratch buffer and the 16-bit grouped GEMM runs on it (``_launch.py``).
"""

import triton
import triton.language as tl


@triton.jit
def _dequant_kernel(
    b_ptr,
    scale_ptr,
    zero_ptr,
    out_ptr,
    R,
    K,
    stride_br,
    stride_sr,
    stride_or,
    GROUP: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[r, k] = (q[r, k] - z[r, k/G]) * s[r, k/G]``, rows of several experts.

    Grid: row tiles x column tiles; a column tile lies in one group (``BLOCK_K``
    divides ``GROUP``, or one group spans the row). Rows are the experts' rows
    flattened (``E * N``). Codes become floats by bit pattern: ``q`` or-ed into the
    mantissa of 2**23 is ``2**23 + q`` exactly, so no int-to-float instruction runs.
    """
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    k0 = tl.program_id(1) * BLOCK_K
    r_mask = offs_r < R
    rows = offs_r.to(tl.int64)
    offs_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    mask = r_mask[:, None] & (offs_p[None, :] < K // 2)
    packed = tl.load(b_ptr + rows[:, None] * stride_br + offs_p[None, :], mask=mask)
    q8 = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_R, BLOCK_K))
    q = (q8.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True)  # 2**23 + q
    g_ptr = rows * stride_sr + k0 // GROUP
    s = tl.load(scale_ptr + g_ptr, mask=r_mask, other=0.0).to(tl.float32)
    if HAS_ZP:
        z = tl.load(zero_ptr + g_ptr, mask=r_mask, other=0).to(tl.float32)
    else:
        z = tl.full([BLOCK_R], 8.0, tl.float32)
    w = (q - (z + 8388608.0)[:, None]) * s[:, None]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    out_mask = r_mask[:, None] & (offs_k[None, :] < K)
    tl.store(
        out_ptr + rows[:, None] * stride_or + offs_k[None, :],
        w.to(out_ptr.dtype.element_ty),
        mask=out_mask,
    )
