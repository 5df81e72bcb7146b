"""Triton decode kernel of triton-w4a16: the paired word GEMV, several row tiles a program.

``@triton.jit`` only; the typed host wrapper is ``launch_gemv`` in ``_launch.py``
(``GemvTiles.stream``). The math of ``_kernels_gemv_pairs.py``; what differs is the
program shape. There each program owns one row tile, so every program starts by
waiting for its expert id and its first step's loads. Here a program walks the row
tiles ``j, j + P, j + 2P, ...`` of its pair (``P = tile_stride``, the grid's second
size) in one flat loop over (tile, step), and each step issues the next step's loads
before its own math, across tile boundaries too: the weights stream without a gap
from the program's first step to its last.
"""

import triton
import triton.language as tl

from backends.triton._kernels_gemv import _gemv_store
from backends.triton._kernels_gemv_pairs import _pair_loads, _pair_scale, _pair_step


@triton.jit
def _moe_gemv_stream_kernel(
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
    # row tiles a program strides over
    tile_stride,
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
    ASM: tl.constexpr,
):
    """``_moe_gemv_pairs_kernel``'s contract and math, several row tiles a program.

    Program ``(p, j, s)`` computes the row tiles ``j, j + tile_stride, ...`` (``j <
    tile_stride <= cdiv(N, BLOCK_N)``) of pair ``p`` in K split ``s``::

        e = ids[p]; if e < 0: return
        for it in 0 .. tiles * steps:        (tile = it // steps, step = it % steps)
            load step it + 1 (the next tile's first step after a tile's last)
            acc += paired products of step it
            if step == steps - 1: C[s, p, tile rows] = epilogue(acc); acc = 0
    """
    BH: tl.constexpr = BLOCK_K // 16
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    j = tl.program_id(1)
    pid_s = tl.program_id(2)
    k_lo = pid_s * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = scale_ptr + e.to(tl.int64) * stride_se
    z_e = zero_ptr + e.to(tl.int64) * stride_se
    # an empty split (k_lo >= k_hi) still runs one masked step: its zeros are stored
    steps = tl.maximum(tl.cdiv(k_hi - k_lo, BLOCK_K), 1)
    total = tl.cdiv(tl.cdiv(N, BLOCK_N) - j, tile_stride) * steps
    offs_r = tl.arange(0, BLOCK_N)
    offs_i = tl.arange(0, BH)
    offs_n = j * BLOCK_N + offs_r
    (wa, wb, ua, ub, s, su, z, zu, a0, a1, a2, a3, a4, a5, a6, a7,
     b0, b1, b2, b3, b4, b5, b6, b7) = _pair_loads(
        w_e, s_e, z_e, x_ptr, offs_n.to(tl.int64)[:, None],
        (offs_n + N).to(tl.int64)[:, None], offs_n < N, offs_i, k_lo, k_hi,
        stride_wn, stride_sn, GROUP, BLOCK_K, EVEN, GATED, HAS_ZP, PREFETCH=True,
    )  # fmt: skip
    acc = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
    for it in range(total):
        cur_n = offs_n
        cwa, cwb, cua, cub, cs, csu, cz, czu = wa, wb, ua, ub, s, su, z, zu
        c0, c1, c2, c3, c4, c5, c6, c7 = a0, a1, a2, a3, a4, a5, a6, a7
        d0, d1, d2, d3, d4, d5, d6, d7 = b0, b1, b2, b3, b4, b5, b6, b7
        nxt = it + 1
        tile = nxt // steps
        offs_n = (j + tile * tile_stride) * BLOCK_N + offs_r
        (wa, wb, ua, ub, s, su, z, zu, a0, a1, a2, a3, a4, a5, a6, a7,
         b0, b1, b2, b3, b4, b5, b6, b7) = _pair_loads(
            w_e, s_e, z_e, x_ptr, offs_n.to(tl.int64)[:, None],
            (offs_n + N).to(tl.int64)[:, None], (offs_n < N) & (nxt < total), offs_i,
            k_lo + (nxt - tile * steps) * BLOCK_K, k_hi, stride_wn, stride_sn,
            GROUP, BLOCK_K, EVEN, GATED, HAS_ZP, PREFETCH=True,
        )  # fmt: skip
        pw, inv = _pair_scale(c0, c1, c2, c3, c4, c5, c6, c7,
                              d0, d1, d2, d3, d4, d5, d6, d7)  # fmt: skip
        h0, h1, h2, h3 = c0 * inv, c1 * inv, c2 * inv, c3 * inv
        h4, h5, h6, h7 = c4 * inv, c5 * inv, c6 * inv, c7 * inv
        g0, g1, g2, g3 = d0 * inv, d1 * inv, d2 * inv, d3 * inv
        g4, g5, g6, g7 = d4 * inv, d5 * inv, d6 * inv, d7 * inv
        acc += _pair_step(
            cwa, cwb, cs, cz, pw, h0, h1, h2, h3, h4, h5, h6, h7,
            g0, g1, g2, g3, g4, g5, g6, g7, ASM,
        )  # fmt: skip
        if GATED:
            acc_up += _pair_step(
                cua, cub, csu, czu, pw, h0, h1, h2, h3, h4, h5, h6, h7,
                g0, g1, g2, g3, g4, g5, g6, g7, ASM,
            )  # fmt: skip
        if nxt % steps == 0:  # the tile's last step: its epilogue, fresh sums
            _gemv_store(
                tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), c_ptr, topk_weights_ptr,
                bias_ptr, p, e, pid_s, cur_n, cur_n < N, N, alpha, limit, stride_cs,
                stride_cm, stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
            )  # fmt: skip
            acc = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
