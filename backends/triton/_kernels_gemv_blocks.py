"""Triton decode kernel of triton-w4a16: the expert-major paired GEMV (``GemvTiles.tokens``).

``@triton.jit`` only; the typed host wrapper is ``launch_gemv`` in ``_launch.py``.
The math of ``_kernels_gemv_pairs.py`` (two words of a group per float16 chain), with
one program per row block of the device alignment (``align_pairs_to_blocks``: up to
``TOKENS`` routed pairs of one expert) instead of one per pair: each step's weight
words are read and dequantized once and multiplied with every pair's input, so an
expert that two to four pairs route to is read once, not once per pair.
"""

import triton
import triton.language as tl

from backends.triton._kernels import _grid_dependency
from backends.triton._kernels_gemv import _gemv_store, _gemv_tile
from backends.triton._kernels_gemv_pairs import (
    _pair_cols,
    _pair_dot,
    _pair_loads,
    _pair_planes,
    _pair_scale,
)
from backends.triton._kernels_gemv_words import _half2, _half_bits


def _multi_dot_asm(tokens: int) -> str:
    """PTX: ``_HALF2_PAIR_ASM`` of two words for ``tokens`` pairs, decoded once.

    Outputs ``$0 .. $(tokens - 1)`` (float32); inputs the words ``$tokens``,
    ``$tokens + 1``, the zero-point halves (``_codes_asm``) and, per pair ``j``, its 8
    half2 input pairs from ``$(tokens + 4 + 8 j)``. The codes of both words are
    decoded into 8 half2 registers once; each pair's 16 products are then summed in
    float16 pairs and converted as ``_HALF2_PAIR_ASM`` does (the same operations in
    the same order, so each output equals that kernel's bit for bit).
    """
    wa, wb, za, zb = (f"${tokens + i}" for i in range(4))
    lines = [
        "{",
        ".reg .b32 a, b, c, d, e, f, g, h, t, acc, k16;",
        ".reg .b16 lo, hi;",
        ".reg .f32 flo, fhi;",
        "mov.b32 k16, 0x2C002C00;",
    ]
    for word, regs in ((wa, "abcd"), (wb, "efgh")):
        r0, r1, r2, r3 = regs
        lines += [
            f"shr.u32 t, {word}, 8;",
            f"lop3.b32 {r0}, {word}, 0x000F000F, 0x64006400, 0xEA;",
            f"lop3.b32 {r1}, {word}, 0x00F000F0, 0x64006400, 0xEA;",
            f"lop3.b32 {r2}, t, 0x000F000F, 0x64006400, 0xEA;",
            f"lop3.b32 {r3}, t, 0x00F000F0, 0x64006400, 0xEA;",
            f"sub.f16x2 {r0}, {r0}, {za};",
            f"fma.rn.f16x2 {r1}, {r1}, k16, {zb};",
            f"sub.f16x2 {r2}, {r2}, {za};",
            f"fma.rn.f16x2 {r3}, {r3}, k16, {zb};",
        ]
    for j in range(tokens):
        first = tokens + 4 + 8 * j
        lines.append(f"mul.f16x2 acc, a, ${first};")
        lines += [
            f"fma.rn.f16x2 acc, {r}, ${first + i}, acc;"
            for i, r in enumerate("abcdefgh")
            if i > 0
        ]
        lines += [
            "mov.b32 {lo, hi}, acc;",
            "cvt.f32.f16 flo, lo;",
            "cvt.f32.f16 fhi, hi;",
            f"add.f32 ${j}, flo, fhi;",
        ]
    return "\n".join([*lines, "}"])


_DOT1_ASM = tl.constexpr(_multi_dot_asm(1))
_DOT2_ASM = tl.constexpr(_multi_dot_asm(2))
_DOT4_ASM = tl.constexpr(_multi_dot_asm(4))


@triton.jit
def _token_planes(
    c0, c1, c2, c3, c4, c5, c6, c7, e0, e1, e2, e3, e4, e5, e6, e7, ASM: tl.constexpr,
):  # fmt: skip
    """One pair's step inputs: ``2^E`` (``_pair_scale``) and its 16 scaled planes.

    ``c*``, ``e*``: the raw planes of ``wa`` and ``wb`` (``_pair_planes``), divided by
    the step's power of two as the paired kernel does. ``ASM``: the first 8 returned
    are the half2 input pairs of ``_multi_dot_asm`` (``[1, BW / 2]`` int32; the other 8
    repeat the first, unread), so they are packed once per pair and step, not per
    matrix; else the 16 float32 planes for ``_pair_dot``.
    """
    pw, inv = _pair_scale(c0, c1, c2, c3, c4, c5, c6, c7,
                          e0, e1, e2, e3, e4, e5, e6, e7)  # fmt: skip
    h0, h1, h2, h3 = c0 * inv, c1 * inv, c2 * inv, c3 * inv
    h4, h5, h6, h7 = c4 * inv, c5 * inv, c6 * inv, c7 * inv
    k0, k1, k2, k3 = e0 * inv, e1 * inv, e2 * inv, e3 * inv
    k4, k5, k6, k7 = e4 * inv, e5 * inv, e6 * inv, e7 * inv
    if ASM:
        h0, h1, h2, h3 = (_half2(h0, h4)[None, :], _half2(h1, h5)[None, :],
                          _half2(h2, h6)[None, :], _half2(h3, h7)[None, :])  # fmt: skip
        h4, h5, h6, h7 = (_half2(k0, k4)[None, :], _half2(k1, k5)[None, :],
                          _half2(k2, k6)[None, :], _half2(k3, k7)[None, :])  # fmt: skip
        k0, k1, k2, k3, k4, k5, k6, k7 = h0, h1, h2, h3, h4, h5, h6, h7
    return (pw, h0, h1, h2, h3, h4, h5, h6, h7,
            k0, k1, k2, k3, k4, k5, k6, k7)  # fmt: skip


@triton.jit
def _zero_halves(z):
    """``_codes_asm``'s zero-point operands: half2 ``1024 + z`` and ``-(64 + z)``."""
    za = _half_bits(z + 1024.0)
    zb = _half_bits(-(z + 64.0))
    return za | (za << 16), zb | (zb << 16)


@triton.jit
def _matrix_step(
    wa, wb, z, scale, rows_b, acc0, acc1, acc2, acc3,
    pw0, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
    pw1, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15,
    pw2, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
    pw3, y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15,
    TOKENS: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """One matrix's (gate or up) step for the block's pairs: ``_pair_step`` of each.

    ``ASM``: one inline-PTX block per element decodes the two words once for as many
    pairs as the block holds (``_DOT4_ASM`` from 3 pairs, ``_DOT2_ASM`` for 2,
    ``_DOT1_ASM`` for 1; a 4-pair block of 3 computes its empty slot and drops it);
    else ``_pair_dot`` per pair. Slots past the block's ``rows_b`` pairs keep their
    accumulators as they are (they are not stored).
    """
    if ASM:
        za, zb = _zero_halves(z)
        if TOKENS == 4 and rows_b > 2:
            t0, t1, t2, t3 = tl.inline_asm_elementwise(
                _DOT4_ASM, "=r,=r,=r,=r" + ",r" * 36,
                [wa, wb, za, zb, v0, v1, v2, v3, v4, v5, v6, v7,
                 w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7,
                 y0, y1, y2, y3, y4, y5, y6, y7],
                dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                is_pure=True, pack=1,
            )  # fmt: skip
            acc0 += t0 * (scale * pw0)
            acc1 += t1 * (scale * pw1)
            acc2 += t2 * (scale * pw2)
            acc3 += t3 * (scale * pw3)
        elif TOKENS >= 2 and rows_b > 1:
            t0, t1 = tl.inline_asm_elementwise(
                _DOT2_ASM, "=r,=r" + ",r" * 20,
                [wa, wb, za, zb, v0, v1, v2, v3, v4, v5, v6, v7,
                 w0, w1, w2, w3, w4, w5, w6, w7],
                dtype=(tl.float32, tl.float32), is_pure=True, pack=1,
            )  # fmt: skip
            acc0 += t0 * (scale * pw0)
            acc1 += t1 * (scale * pw1)
        else:
            t0 = tl.inline_asm_elementwise(
                _DOT1_ASM, "=r" + ",r" * 12,
                [wa, wb, za, zb, v0, v1, v2, v3, v4, v5, v6, v7],
                dtype=tl.float32, is_pure=True, pack=1,
            )  # fmt: skip
            acc0 += t0 * (scale * pw0)
    else:
        acc0 += _pair_dot(
            wa, wb, z, v0, v1, v2, v3, v4, v5, v6, v7,
            v8, v9, v10, v11, v12, v13, v14, v15, False,  # noqa: FBT003
        ) * (scale * pw0)  # fmt: skip
        if TOKENS >= 2 and rows_b > 1:
            acc1 += _pair_dot(
                wa, wb, z, w0, w1, w2, w3, w4, w5, w6, w7,
                w8, w9, w10, w11, w12, w13, w14, w15, False,  # noqa: FBT003
            ) * (scale * pw1)  # fmt: skip
        if TOKENS == 4 and rows_b > 2:
            acc2 += _pair_dot(
                wa, wb, z, x0, x1, x2, x3, x4, x5, x6, x7,
                x8, x9, x10, x11, x12, x13, x14, x15, False,  # noqa: FBT003
            ) * (scale * pw2)  # fmt: skip
        if TOKENS == 4 and rows_b > 3:
            acc3 += _pair_dot(
                wa, wb, z, y0, y1, y2, y3, y4, y5, y6, y7,
                y8, y9, y10, y11, y12, y13, y14, y15, False,  # noqa: FBT003
            ) * (scale * pw3)  # fmt: skip
    return acc0, acc1, acc2, acc3


@triton.jit
def _block_pair(sorted_ptr, b, t: tl.constexpr, rows_b, p0, TOKENS: tl.constexpr):
    """Pair ``t >= 1`` of row block ``b`` (``p0``, the first, past the block's rows)."""
    held = rows_b > t
    p = tl.load(sorted_ptr + b * TOKENS + t, mask=held, other=0)
    return tl.where(held, p, p0)


@triton.jit
def _moe_gemv_blocks_kernel(
    # pointers
    a_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    c_ptr,
    sorted_ptr,
    block_expert_ptr,
    block_rows_ptr,
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
    TOKENS: tl.constexpr,
):
    """``_moe_gemv_pairs_kernel``'s math for up to ``TOKENS`` (1-4) pairs of one expert.

    Grid: row blocks x column tiles x K splits. Block ``b`` (``BlockAlignment``) holds
    ``block_rows[b]`` pairs of expert ``block_expert[b]`` (``-1``: an unused block,
    which returns) at ``sorted[b * TOKENS ...]``. Per step the program loads the words,
    scales and zero points once (``_pair_loads``, which also loads the first pair's
    input planes), scales each pair's input planes, and per element decodes the codes
    once for all the block's pairs (``_matrix_step``): each pair's output is bit for
    bit the paired kernel's. Slots past the block's rows
    repeat its first pair and are not stored. Every other meta-parameter as in the
    paired kernel (no ``PREFETCH``).
    """
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b)
    if e < 0:
        return
    _grid_dependency(PDL_WAIT, PDL_NEXT)  # alignment and ids come from before w13
    rows_b = tl.load(block_rows_ptr + b)
    p0 = tl.load(sorted_ptr + b * TOKENS)
    p1 = _block_pair(sorted_ptr, b, 1, rows_b, p0, TOKENS)
    p2 = _block_pair(sorted_ptr, b, 2, rows_b, p0, TOKENS)
    p3 = _block_pair(sorted_ptr, b, 3, rows_b, p0, TOKENS)
    offs_n, n_mask, k_lo, k_hi, x0_ptr, w_e, s_e, z_e = _gemv_tile(
        p0, e, a_ptr, w_ptr, scale_ptr, zero_ptr, N, K, k_per_split, stride_am,
        stride_we, stride_se, A_DIV, BLOCK_N,
    )  # fmt: skip
    x1_ptr = a_ptr + (p1 // A_DIV).to(tl.int64) * stride_am
    x2_ptr = a_ptr + (p2 // A_DIV).to(tl.int64) * stride_am
    x3_ptr = a_ptr + (p3 // A_DIV).to(tl.int64) * stride_am
    row_tma = e * (stride_we // stride_wn) + tl.program_id(1) * BLOCK_N
    rows = offs_n.to(tl.int64)[:, None]
    up_rows = (offs_n + N).to(tl.int64)[:, None]
    BH: tl.constexpr = BLOCK_K // 16
    offs_i = tl.arange(0, BH)
    acc0 = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
    up0 = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
    acc1 = acc0
    up1 = up0
    acc2 = acc0
    up2 = up0
    acc3 = acc0
    up3 = up0
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=LOOP_STAGES):
        (wa, wb, ua, ub, s, su, z, zu, a0, a1, a2, a3, a4, a5, a6, a7,
         c0, c1, c2, c3, c4, c5, c6, c7) = _pair_loads(
            w_e, s_e, z_e, x0_ptr, rows, up_rows, n_mask, offs_i, k0, k_hi,
            stride_wn, stride_sn, w_desc, row_tma, row_tma + N, GROUP, BLOCK_K, EVEN,
            GATED, HAS_ZP, False, TMA,  # noqa: FBT003 (no PREFETCH)
        )  # fmt: skip
        (pw0, v0, v1, v2, v3, v4, v5, v6, v7,
         v8, v9, v10, v11, v12, v13, v14, v15) = _token_planes(
            a0, a1, a2, a3, a4, a5, a6, a7, c0, c1, c2, c3, c4, c5, c6, c7, ASM
        )  # fmt: skip
        wa_i, wb_i, a_mask, b_mask = _pair_cols(
            offs_i, k0, k_hi, GROUP, BLOCK_K, EVEN, False,  # noqa: FBT003
        )  # fmt: skip
        pw1, pw2, pw3 = pw0, pw0, pw0
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
        w8, w9, w10, w11, w12, w13, w14, w15 = v8, v9, v10, v11, v12, v13, v14, v15
        x0, x1, x2, x3, x4, x5, x6, x7 = v0, v1, v2, v3, v4, v5, v6, v7
        x8, x9, x10, x11, x12, x13, x14, x15 = v8, v9, v10, v11, v12, v13, v14, v15
        y0, y1, y2, y3, y4, y5, y6, y7 = v0, v1, v2, v3, v4, v5, v6, v7
        y8, y9, y10, y11, y12, y13, y14, y15 = v8, v9, v10, v11, v12, v13, v14, v15
        if TOKENS >= 2:  # slots past the block load the first pair's inputs again
            (a0, a1, a2, a3, a4, a5, a6, a7,
             c0, c1, c2, c3, c4, c5, c6, c7) = _pair_planes(
                x1_ptr, wa_i, wb_i, a_mask, b_mask
            )  # fmt: skip
            (pw1, w0, w1, w2, w3, w4, w5, w6, w7,
             w8, w9, w10, w11, w12, w13, w14, w15) = _token_planes(
                a0, a1, a2, a3, a4, a5, a6, a7, c0, c1, c2, c3, c4, c5, c6, c7, ASM
            )  # fmt: skip
        if TOKENS >= 4:
            (a0, a1, a2, a3, a4, a5, a6, a7,
             c0, c1, c2, c3, c4, c5, c6, c7) = _pair_planes(
                x2_ptr, wa_i, wb_i, a_mask, b_mask
            )  # fmt: skip
            (pw2, x0, x1, x2, x3, x4, x5, x6, x7,
             x8, x9, x10, x11, x12, x13, x14, x15) = _token_planes(
                a0, a1, a2, a3, a4, a5, a6, a7, c0, c1, c2, c3, c4, c5, c6, c7, ASM
            )  # fmt: skip
            (a0, a1, a2, a3, a4, a5, a6, a7,
             c0, c1, c2, c3, c4, c5, c6, c7) = _pair_planes(
                x3_ptr, wa_i, wb_i, a_mask, b_mask
            )  # fmt: skip
            (pw3, y0, y1, y2, y3, y4, y5, y6, y7,
             y8, y9, y10, y11, y12, y13, y14, y15) = _token_planes(
                a0, a1, a2, a3, a4, a5, a6, a7, c0, c1, c2, c3, c4, c5, c6, c7, ASM
            )  # fmt: skip
        acc0, acc1, acc2, acc3 = _matrix_step(
            wa, wb, z.to(tl.float32), s.to(tl.float32), rows_b, acc0, acc1, acc2, acc3,
            pw0, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
            pw1, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15,
            pw2, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
            pw3, y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15,
            TOKENS, ASM,
        )  # fmt: skip
        if GATED:
            up0, up1, up2, up3 = _matrix_step(
                ua, ub, zu.to(tl.float32), su.to(tl.float32), rows_b,
                up0, up1, up2, up3,
                pw0, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14,
                v15,
                pw1, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14,
                w15,
                pw2, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14,
                x15,
                pw3, y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14,
                y15,
                TOKENS, ASM,
            )  # fmt: skip
    pid_s = tl.program_id(2)
    _gemv_store(
        tl.sum(acc0, axis=1), tl.sum(up0, axis=1), c_ptr, topk_weights_ptr, bias_ptr,
        p0, e, pid_s, offs_n, n_mask, N, alpha, limit, stride_cs, stride_cm,
        stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
    )  # fmt: skip
    if TOKENS >= 2:
        _gemv_store(
            tl.sum(acc1, axis=1), tl.sum(up1, axis=1), c_ptr, topk_weights_ptr,
            bias_ptr, p1, e, pid_s, offs_n, n_mask & (rows_b > 1), N, alpha, limit,
            stride_cs, stride_cm, stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
        )  # fmt: skip
    if TOKENS >= 4:
        _gemv_store(
            tl.sum(acc2, axis=1), tl.sum(up2, axis=1), c_ptr, topk_weights_ptr,
            bias_ptr, p2, e, pid_s, offs_n, n_mask & (rows_b > 2), N, alpha, limit,
            stride_cs, stride_cm, stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
        )  # fmt: skip
        _gemv_store(
            tl.sum(acc3, axis=1), tl.sum(up3, axis=1), c_ptr, topk_weights_ptr,
            bias_ptr, p3, e, pid_s, offs_n, n_mask & (rows_b > 3), N, alpha, limit,
            stride_cs, stride_cm, stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
        )  # fmt: skip
