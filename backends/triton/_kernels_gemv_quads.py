"""Triton decode kernel of triton-w4a16 on int32 words, four words of a group per chain.

``@triton.jit`` only; the typed host wrapper is ``launch_gemv`` in ``_launch.py``
(``GemvTiles.quads``). The paired kernel (``_kernels_gemv_pairs.py``) with each
float16 chain summing four words of one row and one group: one float32 conversion,
one scale and one accumulation for 32 codes instead of 16.
"""

import triton
import triton.language as tl

from backends.triton._kernels import _grid_dependency
from backends.triton._kernels_gemv import _gemv_store, _gemv_tile
from backends.triton._kernels_gemv_words import (
    _ASM_HEAD,
    _ASM_TAIL,
    _codes_asm,
    _group_params,
    _half2,
    _half_bits,
    _products_asm,
    _step_scale,
    _word_dot,
    _x_plane,
)

_HALF2_QUAD_ASM = tl.constexpr(
    _ASM_HEAD
    + _codes_asm("$1", "$5", "$6")
    + _products_asm(7, start=True)
    + _codes_asm("$2", "$5", "$6")
    + _products_asm(11, start=False)
    + _codes_asm("$3", "$5", "$6")
    + _products_asm(15, start=False)
    + _codes_asm("$4", "$5", "$6")
    + _products_asm(19, start=False)
    + _ASM_TAIL
)
"""``_HALF2_ASM`` on four words of one row and one group (``$1..$4``): their 32
products summed in float16 pairs (``$7..$10`` the first word's input pairs, then 4 a
word), one conversion to float32 for all. The sums stay below ``4 * 15 * 16 = 960``."""


@triton.jit
def _planes(x_ptr, w, m):
    """The 8 input planes ``x[8 w + j]`` of word columns ``w`` (float32, masked)."""
    return (
        _x_plane(x_ptr, w, m, 0), _x_plane(x_ptr, w, m, 1), _x_plane(x_ptr, w, m, 2),
        _x_plane(x_ptr, w, m, 3), _x_plane(x_ptr, w, m, 4), _x_plane(x_ptr, w, m, 5),
        _x_plane(x_ptr, w, m, 6), _x_plane(x_ptr, w, m, 7),
    )  # fmt: skip


@triton.jit
def _abs_max(a, b, c, d, j: tl.constexpr):
    """``max |plane j|`` over the four words' planes."""
    return tl.maximum(
        tl.maximum(tl.abs(a[j]), tl.abs(b[j])), tl.maximum(tl.abs(c[j]), tl.abs(d[j]))
    )


@triton.jit
def _scaled(p, inv):
    """The 8 planes ``p`` times ``inv`` (the step's ``2^-E``)."""
    return (
        p[0] * inv, p[1] * inv, p[2] * inv, p[3] * inv,
        p[4] * inv, p[5] * inv, p[6] * inv, p[7] * inv,
    )  # fmt: skip


@triton.jit
def _half2s(p):
    """``_HALF2_ASM``'s 4 input pairs ``(x_0, x_4) .. (x_3, x_7)`` of one word."""
    return (
        _half2(p[0], p[4])[None, :], _half2(p[1], p[5])[None, :],
        _half2(p[2], p[6])[None, :], _half2(p[3], p[7])[None, :],
    )  # fmt: skip


@triton.jit
def _quad_words(
    w_desc, row, k0, BLOCK_N: tl.constexpr, BW: tl.constexpr, Q: tl.constexpr
):
    """A step's four ``[BLOCK_N, BW / 4]`` word tiles from ``row`` on, by TMA.

    One bulk copy of the step's whole rows, split in registers: element ``i`` of tile
    ``j`` is word ``(i // Q) * 4 Q + j Q + i % Q`` of the step.
    """
    row = tl.cast(row, tl.int32)  # descriptor offsets are int32
    col = tl.cast(k0 // 8, tl.int32)
    w = w_desc.load([row, col])
    w = tl.reshape(w, [BLOCK_N, BW // (4 * Q), 2, 2, Q])
    w = tl.permute(w, (0, 1, 4, 2, 3))  # [.., i // Q, i % Q, j // 2, j % 2]
    lo, hi = tl.split(tl.reshape(w, [BLOCK_N, BW // 4, 2, 2]))  # j % 2 = 0, 1
    w0, w2 = tl.split(lo)
    w1, w3 = tl.split(hi)
    return w0, w1, w2, w3


@triton.jit
def _quad_loads(
    w_e, s_e, z_e, x_ptr, rows, n_mask, offs_i, k0, k_hi, stride_wn, stride_sn,
    w_desc, row_tma, GROUP: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    HAS_ZP: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """One matrix's step: four word tiles, scales and zero points (one per element).

    Element ``i`` of tile ``j`` is word ``w0(i) + j Q`` of the step, the four quarters
    of one group's words (of the step's, steps within a group)::

        Q = BW / 4 if BLOCK_K <= GROUP else GROUP / 32
        w0(i) = (i // Q) * 4 Q + i % Q

    ``TMA``: through ``w_desc`` (``_quad_words``), unmasked as in the paired kernel.
    """
    BW: tl.constexpr = BLOCK_K // 8
    WG: tl.constexpr = GROUP // 8
    Q: tl.constexpr = BW // 4 if BLOCK_K <= GROUP else WG // 4
    w0 = tl.multiple_of(k0 // 8, BW) + (offs_i // Q) * (4 * Q) + offs_i % Q
    row_mask = n_mask[:, None]
    if BLOCK_K <= GROUP:  # one group per step
        g_col = tl.zeros([1, 1], dtype=tl.int32) + k0 // GROUP
        s_mask = row_mask
    else:
        g_col = (w0 // WG)[None, :]
        s_mask = row_mask if EVEN else row_mask & (w0 < k_hi // 8)[None, :]
    BN: tl.constexpr = n_mask.shape[0]
    if TMA:
        q0, q1, q2, q3 = _quad_words(w_desc, row_tma, k0, BN, BW, Q)
    else:
        base = w_e + rows * stride_wn
        if EVEN:
            q0 = tl.load(base + w0[None, :], mask=row_mask, other=0)
            q1 = tl.load(base + (w0 + Q)[None, :], mask=row_mask, other=0)
            q2 = tl.load(base + (w0 + 2 * Q)[None, :], mask=row_mask, other=0)
            q3 = tl.load(base + (w0 + 3 * Q)[None, :], mask=row_mask, other=0)
        else:
            kw = k_hi // 8
            q0 = tl.load(
                base + w0[None, :], mask=row_mask & (w0 < kw)[None, :], other=0
            )
            q1 = tl.load(
                base + (w0 + Q)[None, :], mask=row_mask & (w0 + Q < kw)[None, :],
                other=0,
            )  # fmt: skip
            q2 = tl.load(
                base + (w0 + 2 * Q)[None, :],
                mask=row_mask & (w0 + 2 * Q < kw)[None, :], other=0,
            )  # fmt: skip
            q3 = tl.load(
                base + (w0 + 3 * Q)[None, :],
                mask=row_mask & (w0 + 3 * Q < kw)[None, :], other=0,
            )  # fmt: skip
    s, z = _group_params(s_e, z_e, rows, g_col, s_mask, stride_sn, HAS_ZP)
    return q0, q1, q2, q3, s, z


@triton.jit
def _quad_step(q0, q1, q2, q3, s, z, pw, h0, h1, h2, h3, ASM: tl.constexpr):
    """``scale * 2^E * sum of the four words' dots`` per element.

    ``h0..h3``: each word's 8 scaled planes. ``ASM``: one ``_HALF2_QUAD_ASM``; else
    four float32 ``_word_dot`` sums (the interpreter).
    """
    zf = z.to(tl.float32)
    if ASM:
        za = _half_bits(zf + 1024.0)
        zb = _half_bits(-(zf + 64.0))
        p0 = _half2s(h0)
        p1 = _half2s(h1)
        p2 = _half2s(h2)
        p3 = _half2s(h3)
        t = tl.inline_asm_elementwise(
            _HALF2_QUAD_ASM, "=r" + ",r" * 22,
            [q0, q1, q2, q3, za | (za << 16), zb | (zb << 16),
             p0[0], p0[1], p0[2], p0[3], p1[0], p1[1], p1[2], p1[3],
             p2[0], p2[1], p2[2], p2[3], p3[0], p3[1], p3[2], p3[3]],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        t = _word_dot(
            q0, zf, h0[0], h0[1], h0[2], h0[3], h0[4], h0[5], h0[6], h0[7], ASM
        )
        t += _word_dot(
            q1, zf, h1[0], h1[1], h1[2], h1[3], h1[4], h1[5], h1[6], h1[7], ASM
        )
        t += _word_dot(
            q2, zf, h2[0], h2[1], h2[2], h2[3], h2[4], h2[5], h2[6], h2[7], ASM
        )
        t += _word_dot(
            q3, zf, h3[0], h3[1], h3[2], h3[3], h3[4], h3[5], h3[6], h3[7], ASM
        )
    return t * (s.to(tl.float32) * pw)


@triton.jit
def _moe_gemv_quads_kernel(
    # pointers
    a_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    c_ptr,
    ids_ptr,
    topk_weights_ptr,
    bias_ptr,
    w_desc,
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
    EVEN: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    ASM: tl.constexpr,
    PDL_WAIT: tl.constexpr,
    PDL_NEXT: tl.constexpr,
    TMA: tl.constexpr,
):
    """``_moe_gemv_pairs_kernel``'s contract and math, four words of a group per chain.

    Needs ``GROUP >= 32`` (four words a group) besides ``int4_words_fit``; no
    ``PREFETCH``. Per step and row each chain sums 32 products in float16 (below
    ``4 * 15 * 16`` in size).
    """
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    _grid_dependency(PDL_WAIT, PDL_NEXT)  # GemvTiles.pdl: ids come from before w13
    offs_n, n_mask, k_lo, k_hi, x_ptr, w_e, s_e, z_e = _gemv_tile(
        p, e, a_ptr, w_ptr, scale_ptr, zero_ptr, N, K, k_per_split, stride_am,
        stride_we, stride_se, A_DIV, BLOCK_N,
    )  # fmt: skip
    row_tma = e * (stride_we // stride_wn) + tl.program_id(1) * BLOCK_N
    rows = offs_n.to(tl.int64)[:, None]
    up_rows = (offs_n + N).to(tl.int64)[:, None]
    BW: tl.constexpr = BLOCK_K // 8
    WG: tl.constexpr = GROUP // 8
    Q: tl.constexpr = BW // 4 if BLOCK_K <= GROUP else WG // 4
    BQ: tl.constexpr = BW // 4
    acc = tl.zeros([BLOCK_N, BQ], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BQ], dtype=tl.float32)
    offs_i = tl.arange(0, BQ)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=LOOP_STAGES):
        q0, q1, q2, q3, s, z = _quad_loads(
            w_e, s_e, z_e, x_ptr, rows, n_mask, offs_i, k0, k_hi, stride_wn,
            stride_sn, w_desc, row_tma, GROUP, BLOCK_K, EVEN, HAS_ZP, TMA,
        )  # fmt: skip
        w0 = tl.multiple_of(k0 // 8, BW) + (offs_i // Q) * (4 * Q) + offs_i % Q
        kw = k_hi // 8
        x0 = _planes(x_ptr, w0, w0 < kw)
        x1 = _planes(x_ptr, w0 + Q, w0 + Q < kw)
        x2 = _planes(x_ptr, w0 + 2 * Q, w0 + 2 * Q < kw)
        x3 = _planes(x_ptr, w0 + 3 * Q, w0 + 3 * Q < kw)
        pw, inv = _step_scale(
            _abs_max(x0, x1, x2, x3, 0), _abs_max(x0, x1, x2, x3, 1),
            _abs_max(x0, x1, x2, x3, 2), _abs_max(x0, x1, x2, x3, 3),
            _abs_max(x0, x1, x2, x3, 4), _abs_max(x0, x1, x2, x3, 5),
            _abs_max(x0, x1, x2, x3, 6), _abs_max(x0, x1, x2, x3, 7),
        )  # fmt: skip
        h0 = _scaled(x0, inv)
        h1 = _scaled(x1, inv)
        h2 = _scaled(x2, inv)
        h3 = _scaled(x3, inv)
        acc += _quad_step(q0, q1, q2, q3, s, z, pw, h0, h1, h2, h3, ASM)
        if GATED:
            u0, u1, u2, u3, su, zu = _quad_loads(
                w_e, s_e, z_e, x_ptr, up_rows, n_mask, offs_i, k0, k_hi, stride_wn,
                stride_sn, w_desc, row_tma + N, GROUP, BLOCK_K, EVEN, HAS_ZP, TMA,
            )  # fmt: skip
            acc_up += _quad_step(u0, u1, u2, u3, su, zu, pw, h0, h1, h2, h3, ASM)
    _gemv_store(
        tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), c_ptr, topk_weights_ptr, bias_ptr,
        p, e, tl.program_id(2), offs_n, n_mask, N, alpha, limit, stride_cs, stride_cm,
        stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
    )  # fmt: skip
