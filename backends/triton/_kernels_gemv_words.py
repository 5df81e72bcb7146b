"""Triton decode kernel of triton-w4a16 on int32 words: the pair-major GEMV, float32 FMAs.

``@triton.jit`` only; the typed host wrapper is ``launch_gemv`` in ``_launch.py``
(``GemvTiles.words``). Names as in ``_kernels_gemv.py``; ``W`` = int32 words of 8 codes.
"""

import triton
import triton.language as tl

from backends.triton._kernels_gemv import _gemv_store

_CODES_ASM = tl.constexpr("""{
.reg .b32 h;
lop3.b32 $0, $8, 0xF, $9, 0xEA;
lop3.b32 $1, $8, 0xF0, $9, 0xEA;
lop3.b32 $2, $8, 0xF00, $9, 0xEA;
lop3.b32 $3, $8, 0xF000, $9, 0xEA;
lop3.b32 $4, $8, 0xF0000, $9, 0xEA;
shr.u32 h, $8, 12;
lop3.b32 $5, h, 0xF00, $9, 0xEA;
lop3.b32 $6, h, 0xF000, $9, 0xEA;
lop3.b32 $7, h, 0xF0000, $9, 0xEA;
}""")
"""Nibble ``j`` of word ``$8`` kept in place under the exponent bits of float32 ``2^23``
(``$9`` = 0x4B000000: OR-ing an integer below ``2^23`` into its mantissa gives ``2^23 +``
that integer exactly): ``$j`` = ``2^23 + code_j * 16^s_j``, one LOP3 (``(a & b) | c``)
a code, with ``s_j`` = 0, 1, 2, 3, 4 for nibbles 0-4 and 2, 3, 4 for nibbles 5-7 (taken
from the word shifted right by 12)."""


@triton.jit
def _codes(words, ASM: tl.constexpr):
    """Eight float32 tensors: ``2^23 + code_j * 16^s_j`` of each int32 word (``_CODES_ASM``).

    ``ASM``: one inline-PTX block (a LOP3 per code); else the same bits by AND, OR and
    a bitcast (Triton's CPU interpreter). The arithmetic shift leaves the sign's copies
    above bit 19 of ``h``, outside every mask.
    """
    magic = tl.full(words.shape, 0x4B000000, tl.int32)
    if ASM:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _CODES_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [words, magic],
            dtype=(tl.float32,) * 8, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        h = words >> 12
        v0 = ((words & 0xF) | magic).to(tl.float32, bitcast=True)
        v1 = ((words & 0xF0) | magic).to(tl.float32, bitcast=True)
        v2 = ((words & 0xF00) | magic).to(tl.float32, bitcast=True)
        v3 = ((words & 0xF000) | magic).to(tl.float32, bitcast=True)
        v4 = ((words & 0xF0000) | magic).to(tl.float32, bitcast=True)
        v5 = ((h & 0xF00) | magic).to(tl.float32, bitcast=True)
        v6 = ((h & 0xF000) | magic).to(tl.float32, bitcast=True)
        v7 = ((h & 0xF0000) | magic).to(tl.float32, bitcast=True)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _x_plane(x_ptr, wi, i_mask, j: tl.constexpr, inv: tl.constexpr):
    """``x[8 wi + j] * inv`` (``inv`` = ``16^-s_j``) in float32, and ``x[8 wi + j]``."""
    x = tl.load(x_ptr + 8 * wi + j, mask=i_mask, other=0.0).to(tl.float32)
    return x * inv, x


@triton.jit
def _word_step(
    w_e, w_offs, w_mask, s_e, z_e, s_offs, s_mask,
    x0, x1, x2, x3, x4, x5, x6, x7, x_sum,
    HAS_ZP: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """``scale * (sum_j code_j x_j - z sum_j x_j)`` per word of a ``[BLOCK_N, BW]`` tile.

    ``x_j`` arrive divided by ``16^s_j``, so ``(v_j - 2^23) * x_j`` is exact
    ``code_j * x[8 wi + j]`` up to one FMA rounding.
    """
    words = tl.load(w_e + w_offs, mask=w_mask, other=0)
    v0, v1, v2, v3, v4, v5, v6, v7 = _codes(words, ASM)
    t = (v0 - 8388608.0) * x0[None, :]
    t += (v1 - 8388608.0) * x1[None, :]
    t += (v2 - 8388608.0) * x2[None, :]
    t += (v3 - 8388608.0) * x3[None, :]
    t += (v4 - 8388608.0) * x4[None, :]
    t += (v5 - 8388608.0) * x5[None, :]
    t += (v6 - 8388608.0) * x6[None, :]
    t += (v7 - 8388608.0) * x7[None, :]
    s = tl.load(s_e + s_offs, mask=s_mask, other=0.0).to(tl.float32)
    if HAS_ZP:  # noqa: SIM108 (a constexpr branch, resolved at compile time)
        z = tl.load(z_e + s_offs, mask=s_mask, other=0).to(tl.float32)
    else:
        z = 8.0
    return (t - z * x_sum[None, :]) * s


@triton.jit
def _moe_gemv_words_kernel(
    # pointers
    a_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    c_ptr,
    ids_ptr,
    topk_weights_ptr,
    bias_ptr,
    # sizes
    N,
    K,
    k_per_split,
    alpha,
    limit,
    # strides (w in int32 words)
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_cs,
    stride_cm,
    stride_bias,
    # meta-parameters
    A_DIV: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_ZP: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    WEIGHT_ROWS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ASM: tl.constexpr,
):
    """``_moe_gemv_kernel``'s contract on int32 words; three instructions a code at its core.

    Grid, K splits, ``GATED``, ``WEIGHT_ROWS`` and ``HAS_BIAS`` as there. Needs
    ``K % 8 == 0`` and ``GROUP % 8 == 0`` (``int4_words_fit``). Per step each program
    reads ``BLOCK_N`` rows of ``BW = BLOCK_K / 8`` words and 8 input planes
    ``x[8 wi + j]``, each pre-divided by the power of 16 its nibble keeps::

        for each step: v_j = 2^23 + code_j 16^s_j            (a LOP3 per code)
                       t = sum_j (v_j - 2^23) (x_j / 16^s_j)  (FADD + FFMA per code)
                       acc[n, wi] += scale[n, g] * (t - z[n, g] sum_j x_j)
        C[s, p, n] = act(sum_wi acc, sum_wi acc_up) if gated else sum_wi acc
    """
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    BW: tl.constexpr = BLOCK_K // 8
    WG: tl.constexpr = GROUP // 8
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None]
    up_rows = (offs_n + N).to(tl.int64)[:, None]
    pid_s = tl.program_id(2)
    k_lo = pid_s * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = scale_ptr + e.to(tl.int64) * stride_se
    z_e = zero_ptr + e.to(tl.int64) * stride_se
    acc = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    offs_i = tl.arange(0, BW)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        wi = tl.multiple_of(k0 // 8, BW) + offs_i
        i_mask = wi < k_hi // 8
        x0, r0 = _x_plane(x_ptr, wi, i_mask, 0, 1.0)
        x1, r1 = _x_plane(x_ptr, wi, i_mask, 1, 0.0625)
        x2, r2 = _x_plane(x_ptr, wi, i_mask, 2, 0.00390625)
        x3, r3 = _x_plane(x_ptr, wi, i_mask, 3, 0.000244140625)
        x4, r4 = _x_plane(x_ptr, wi, i_mask, 4, 0.0000152587890625)
        x5, r5 = _x_plane(x_ptr, wi, i_mask, 5, 0.00390625)
        x6, r6 = _x_plane(x_ptr, wi, i_mask, 6, 0.000244140625)
        x7, r7 = _x_plane(x_ptr, wi, i_mask, 7, 0.0000152587890625)
        x_sum = r0 + r1 + r2 + r3 + r4 + r5 + r6 + r7
        w_mask = n_mask[:, None] & i_mask[None, :]
        if BLOCK_K <= GROUP:  # one group per step (groups: powers of 2, or the row)
            g_col = tl.zeros([1, 1], dtype=tl.int32) + k0 // GROUP
            s_mask = n_mask[:, None]
        else:
            g_col = (wi // WG)[None, :]
            s_mask = w_mask
        acc += _word_step(
            w_e, rows * stride_wn + wi[None, :], w_mask, s_e, z_e,
            rows * stride_sn + g_col, s_mask,
            x0, x1, x2, x3, x4, x5, x6, x7, x_sum, HAS_ZP, ASM,
        )  # fmt: skip
        if GATED:
            acc_up += _word_step(
                w_e, up_rows * stride_wn + wi[None, :], w_mask, s_e, z_e,
                up_rows * stride_sn + g_col, s_mask,
                x0, x1, x2, x3, x4, x5, x6, x7, x_sum, HAS_ZP, ASM,
            )  # fmt: skip
    _gemv_store(
        tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), c_ptr, topk_weights_ptr,
        bias_ptr, p, e, pid_s, offs_n, n_mask, N, alpha, limit, stride_cs, stride_cm,
        stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
    )  # fmt: skip
