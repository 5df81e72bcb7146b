# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Triton kernel that dequantizes int4 experts to 16 bits (``@triton.jit`` only).

Used by triton-w4a16 at prefill sizes: a chunk of experts is dequantized into a
scratch buffer and the 16-bit grouped GEMM runs on it (``_launch_dequant.py``).
"""

import triton
import triton.language as tl

from backends.triton._kernels_tiles import _load_weight_words


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
    col_tiles,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WORDS: tl.constexpr,
    ASM: tl.constexpr,
    CT: tl.constexpr,
):
    """``out[r, k] = (q[r, k] - z[r, k/G]) * s[r, k/G]``, rows of several experts.

    Grid: one axis, ``col_tiles`` column tiles (fastest) a row tile. Rows are the experts' rows flattened
    (``E * N``). A ``BLOCK_R x BLOCK_K`` tile is ``BLOCK_K / SUB`` sub-tiles of ``SUB``
    columns that each lie in one group (``SUB = min(GROUP, BLOCK_K)``, a power of two
    dividing ``GROUP`` or ``GROUP`` the whole row), so one scale (and zero point) per
    row and sub-tile. Codes become floats by bit pattern: ``q`` or-ed into the
    mantissa of 2**23 is ``2**23 + q`` exactly, so no int-to-float instruction runs.

    ``WORDS`` (``K % 8 == 0``, rows of whole int32 words): the grouped GEMM's word
    loader instead, in dtype ``CT``: with ``ASM`` the output's 16-bit dtype, 8 codes
    in 15 instructions (the launch asks for scales of that dtype, so the result is
    the same: one rounding of the exact ``(q - z) * s``), else float32.
    """
    S: tl.constexpr = BLOCK_K // SUB
    pid = tl.program_id(0)
    k0 = (pid % col_tiles) * BLOCK_K
    offs_r = (pid // col_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = offs_r < R
    rows = offs_r.to(tl.int64)
    if WORDS:
        w = _load_weight_words(
            b_ptr, scale_ptr, zero_ptr, offs_r, r_mask, k0, K // 8, stride_br,
            stride_sr, GROUP, HAS_ZP, BLOCK_R, BLOCK_K, CT, ASM,
        )  # fmt: skip
        offs_c = k0 + tl.arange(0, BLOCK_K)
        tl.store(
            out_ptr + rows[:, None] * stride_or + offs_c[None, :],
            w.to(out_ptr.dtype.element_ty),
            mask=r_mask[:, None] & (offs_c[None, :] < K),
        )
        return
    offs_s = tl.arange(0, S)
    sub0 = k0 + offs_s * SUB  # first column of each sub-tile
    # (BLOCK_R, S, SUB / 2) bytes: byte p of sub-tile s holds columns 2p, 2p + 1
    offs_p = sub0[:, None] // 2 + tl.arange(0, SUB // 2)[None, :]
    mask = r_mask[:, None, None] & (offs_p[None, :, :] < K // 2)
    packed = tl.load(
        b_ptr + rows[:, None, None] * stride_br + offs_p[None, :, :], mask=mask
    )
    q8 = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_R, S, SUB))
    q = (q8.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True)  # 2**23 + q
    g_mask = r_mask[:, None] & (sub0[None, :] < K)
    g_ptr = rows[:, None] * stride_sr + (sub0 // GROUP)[None, :]
    s = tl.load(scale_ptr + g_ptr, mask=g_mask, other=0.0).to(tl.float32)
    if HAS_ZP:
        z = tl.load(zero_ptr + g_ptr, mask=g_mask, other=0).to(tl.float32)
    else:
        z = tl.full([BLOCK_R, S], 8.0, tl.float32)
    w = (q - (z + 8388608.0)[:, :, None]) * s[:, :, None]
    offs_k = sub0[:, None] + tl.arange(0, SUB)[None, :]
    out_mask = r_mask[:, None, None] & (offs_k[None, :, :] < K)
    tl.store(
        out_ptr + rows[:, None, None] * stride_or + offs_k[None, :, :],
        w.to(out_ptr.dtype.element_ty),
        mask=out_mask,
    )
