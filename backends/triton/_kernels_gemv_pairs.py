# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Triton decode kernel of triton-w4a16 on int32 words, two words of a group per chain.

``@triton.jit`` only; the typed host wrapper is ``launch_gemv`` in ``_launch_gemv.py``
(``GemvTiles.paired``). The math of ``_kernels_gemv_words.py`` (half2 products of
codes and inputs scaled per step), with each float16 chain summing two words of one
row and one group: one float32 conversion, one scale and one accumulation for both
(half the accumulators and scale loads); or, with ``INT_DOT``, the two words'
products in integers (``_kernels_gemv_ints.py``, the table's form).
"""

import triton
import triton.language as tl

from backends.triton._kernels import _grid_dependency
from backends.triton._kernels_gemv import _gemv_store, _gemv_tile
from backends.triton._kernels_gemv_ints import _int_pair_math
from backends.triton._kernels_gemv_pair_loads import (
    _f32_planes,
    _pair_cols,
    _pair_loads,
    _pair_params,
)
from backends.triton._kernels_gemv_words import (
    _ASM_HEAD,
    _ASM_TAIL,
    _codes_asm,
    _half2,
    _half_bits,
    _products_asm,
    _step_scale,
    _word_dot,
)

_HALF2_PAIR_ASM = tl.constexpr(
    _ASM_HEAD
    + _codes_asm("$1", "$3", "$4")
    + _products_asm(5, start=True)
    + _codes_asm("$2", "$3", "$4")
    + _products_asm(9, start=False)
    + _ASM_TAIL
)
"""``_HALF2_ASM`` on two words of one row and one group (``$1``, ``$2``): their 16
products summed in float16 pairs (``$5..$8`` the first word's input pairs, ``$9..$12``
the second's), one conversion to float32 for both. The sums stay below
``2 * 15 * 16 = 480``."""


@triton.jit
def _pair_dot(
    wa, wb, z, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
    ASM: tl.constexpr,
):  # fmt: skip
    """``_word_dot`` of word ``wa`` plus that of ``wb`` (same row, same group).

    ``ASM``: one ``_HALF2_PAIR_ASM`` (16 products summed in float16 pairs); else the
    two float32 sums of ``_word_dot``.
    """
    if ASM:
        za = _half_bits(z + 1024.0)
        zb = _half_bits(-(z + 64.0))
        t = tl.inline_asm_elementwise(
            _HALF2_PAIR_ASM, "=r,r,r,r,r,r,r,r,r,r,r,r,r",
            [wa, wb, za | (za << 16), zb | (zb << 16),
             _half2(a0, a4)[None, :], _half2(a1, a5)[None, :],
             _half2(a2, a6)[None, :], _half2(a3, a7)[None, :],
             _half2(b0, b4)[None, :], _half2(b1, b5)[None, :],
             _half2(b2, b6)[None, :], _half2(b3, b7)[None, :]],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        t = _word_dot(wa, z, a0, a1, a2, a3, a4, a5, a6, a7, ASM)
        t += _word_dot(wb, z, b0, b1, b2, b3, b4, b5, b6, b7, ASM)
    return t


@triton.jit
def _pair_step(
    wa, wb, s, z, pw, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
    ASM: tl.constexpr,
):  # fmt: skip
    """``scale * 2^E * (dot(wa) + dot(wb))`` per element of a ``[BLOCK_N, BW / 2]`` tile."""
    t = _pair_dot(
        wa, wb, z.to(tl.float32), a0, a1, a2, a3, a4, a5, a6, a7,
        b0, b1, b2, b3, b4, b5, b6, b7, ASM,
    )  # fmt: skip
    return t * (s.to(tl.float32) * pw)


@triton.jit
def _pair_scale(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    """``_step_scale`` over both halves' 16 input planes."""
    return _step_scale(
        tl.maximum(tl.abs(a0), tl.abs(b0)), tl.maximum(tl.abs(a1), tl.abs(b1)),
        tl.maximum(tl.abs(a2), tl.abs(b2)), tl.maximum(tl.abs(a3), tl.abs(b3)),
        tl.maximum(tl.abs(a4), tl.abs(b4)), tl.maximum(tl.abs(a5), tl.abs(b5)),
        tl.maximum(tl.abs(a6), tl.abs(b6)), tl.maximum(tl.abs(a7), tl.abs(b7)),
    )  # fmt: skip


@triton.jit
def _half_pair_math(
    acc, acc_up, wa, wb, ua, ub, s, su, z, zu,
    c0, c1, c2, c3, c4, c5, c6, c7, d0, d1, d2, d3, d4, d5, d6, d7,
    GATED: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """One step of the paired loop in float16 chains: ``acc`` (and ``acc_up``) added to.

    Arguments as ``_int_pair_math`` (``_kernels_gemv_ints.py``).
    """
    pw, inv = _pair_scale(c0, c1, c2, c3, c4, c5, c6, c7,
                          d0, d1, d2, d3, d4, d5, d6, d7)  # fmt: skip
    h0, h1, h2, h3 = c0 * inv, c1 * inv, c2 * inv, c3 * inv
    h4, h5, h6, h7 = c4 * inv, c5 * inv, c6 * inv, c7 * inv
    g0, g1, g2, g3 = d0 * inv, d1 * inv, d2 * inv, d3 * inv
    g4, g5, g6, g7 = d4 * inv, d5 * inv, d6 * inv, d7 * inv
    acc += _pair_step(
        wa, wb, s, z, pw, h0, h1, h2, h3, h4, h5, h6, h7,
        g0, g1, g2, g3, g4, g5, g6, g7, ASM,
    )  # fmt: skip
    if GATED:
        acc_up += _pair_step(
            ua, ub, su, zu, pw, h0, h1, h2, h3, h4, h5, h6, h7,
            g0, g1, g2, g3, g4, g5, g6, g7, ASM,
        )  # fmt: skip
    return acc, acc_up


@triton.jit
def _pair_math(
    acc, acc_up, wa, wb, ua, ub, s, su, z, zu,
    c0, c1, c2, c3, c4, c5, c6, c7, d0, d1, d2, d3, d4, d5, d6, d7,
    GATED: tl.constexpr, HAS_ZP: tl.constexpr, ASM: tl.constexpr,
    INT_DOT: tl.constexpr,
):  # fmt: skip
    """One step's math: ``_int_pair_math`` with ``INT_DOT``, else ``_half_pair_math``."""
    if INT_DOT:
        acc, acc_up = _int_pair_math(
            acc, acc_up, wa, wb, ua, ub, s, su, z, zu,
            c0, c1, c2, c3, c4, c5, c6, c7, d0, d1, d2, d3, d4, d5, d6, d7,
            GATED, HAS_ZP, ASM,
        )  # fmt: skip
    else:
        acc, acc_up = _half_pair_math(
            acc, acc_up, wa, wb, ua, ub, s, su, z, zu,
            c0, c1, c2, c3, c4, c5, c6, c7, d0, d1, d2, d3, d4, d5, d6, d7,
            GATED, ASM,
        )  # fmt: skip
    return acc, acc_up


@triton.jit
def _paired_loop(
    w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, k_lo, k_hi, stride_wn, stride_sn,
    w_desc, row_tma, up_tma,
    GROUP: tl.constexpr, GATED: tl.constexpr, HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    PREFETCH: tl.constexpr, LOOP_STAGES: tl.constexpr, ASM: tl.constexpr,
    TMA: tl.constexpr, INT_DOT: tl.constexpr, X_AHEAD: tl.constexpr,
):  # fmt: skip
    """The paired K loop: ``[BLOCK_N, BW / 2]`` float32 sums (gate, up).

    Each step's math: ``_half_pair_math`` (float16 chains), or ``_int_pair_math``
    with ``INT_DOT`` (``dp4a``, ``_kernels_gemv_ints.py``). ``PREFETCH``: all of the
    next step's loads before this step's math; else ``X_AHEAD``: the next step's
    scales, zero points and inputs (``_pair_loads`` with ``AHEAD``), the words at
    their step.
    """
    BH: tl.constexpr = BLOCK_K // 16
    acc = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
    offs_i = tl.arange(0, BH)
    if PREFETCH:  # first step's loads; each step then loads the next before its math
        (wa, wb, ua, ub, s, su, z, zu, a0, a1, a2, a3, a4, a5, a6, a7,
         b0, b1, b2, b3, b4, b5, b6, b7) = _pair_loads(
            w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k_lo, k_hi,
            stride_wn, stride_sn, w_desc, row_tma, up_tma, GROUP, BLOCK_K, EVEN, GATED,
            HAS_ZP, PREFETCH, TMA, AHEAD=False,
        )  # fmt: skip
    elif X_AHEAD:  # first step's scales, zero points and inputs
        wa, wb, a_mask, b_mask, _, _, g_col, s_mask = _pair_cols(
            offs_i, n_mask, k_lo, k_hi, GROUP, BLOCK_K, EVEN, PREFETCH=True
        )
        (s, su, z, zu, a0, a1, a2, a3, a4, a5, a6, a7,
         b0, b1, b2, b3, b4, b5, b6, b7) = _pair_params(
            s_e, z_e, x_ptr, rows, up_rows, wa, wb, a_mask, b_mask, g_col, s_mask,
            stride_sn, GATED, HAS_ZP, RAW=True,
        )  # fmt: skip
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=LOOP_STAGES):
        if PREFETCH or X_AHEAD:
            cs, csu, cz, czu = s, su, z, zu
            c0, c1, c2, c3, c4, c5, c6, c7 = a0, a1, a2, a3, a4, a5, a6, a7
            d0, d1, d2, d3, d4, d5, d6, d7 = b0, b1, b2, b3, b4, b5, b6, b7
            if PREFETCH:
                cwa, cwb, cua, cub = wa, wb, ua, ub
                (wa, wb, ua, ub, s, su, z, zu, a0, a1, a2, a3, a4, a5, a6, a7,
                 b0, b1, b2, b3, b4, b5, b6, b7) = _pair_loads(
                    w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k0 + BLOCK_K,
                    k_hi, stride_wn, stride_sn, w_desc, row_tma, up_tma, GROUP,
                    BLOCK_K, EVEN, GATED, HAS_ZP, PREFETCH, TMA, AHEAD=False,
                )  # fmt: skip
            else:
                (c0, c1, c2, c3, c4, c5, c6, c7,
                 d0, d1, d2, d3, d4, d5, d6, d7) = _f32_planes(
                    c0, c1, c2, c3, c4, c5, c6, c7, d0, d1, d2, d3, d4, d5, d6, d7
                )  # fmt: skip
                (cwa, cwb, cua, cub, s, su, z, zu, a0, a1, a2, a3, a4, a5, a6, a7,
                 b0, b1, b2, b3, b4, b5, b6, b7) = _pair_loads(
                    w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k0, k_hi,
                    stride_wn, stride_sn, w_desc, row_tma, up_tma, GROUP, BLOCK_K,
                    EVEN, GATED, HAS_ZP, PREFETCH, TMA, AHEAD=True,
                )  # fmt: skip
        else:
            (cwa, cwb, cua, cub, cs, csu, cz, czu, c0, c1, c2, c3, c4, c5, c6, c7,
             d0, d1, d2, d3, d4, d5, d6, d7) = _pair_loads(
                w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k0, k_hi,
                stride_wn, stride_sn, w_desc, row_tma, up_tma, GROUP, BLOCK_K, EVEN,
                GATED, HAS_ZP, PREFETCH, TMA, AHEAD=False,
            )  # fmt: skip
        acc, acc_up = _pair_math(
            acc, acc_up, cwa, cwb, cua, cub, cs, csu, cz, czu,
            c0, c1, c2, c3, c4, c5, c6, c7, d0, d1, d2, d3, d4, d5, d6, d7,
            GATED, HAS_ZP, ASM, INT_DOT,
        )  # fmt: skip
    return acc, acc_up


@triton.jit
def _moe_gemv_pairs_kernel(
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
    PREFETCH: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    ASM: tl.constexpr,
    PDL_WAIT: tl.constexpr,
    PDL_NEXT: tl.constexpr,
    TMA: tl.constexpr,
    INT_DOT: tl.constexpr,
    X_AHEAD: tl.constexpr,
):
    """``_moe_gemv_words_kernel``'s contract and math, two words of a group per chain.

    Needs ``GROUP >= 16`` (two words a group) besides ``int4_words_fit``; grid, K
    splits, ``GATED``, ``WEIGHT_ROWS`` and ``HAS_BIAS`` as there. Per step and row each
    chain sums 16 products in float16 (below ``2 * 15 * 16`` in size): about 4e-4
    relative error against float32 math on the same values (3e-4 with one word a
    chain).

    ``TMA`` (``GemvTiles.tma``): the weight words come by bulk tensor copies through
    ``w_desc`` (``_tma_words``), which Triton pipelines through shared memory
    ``LOOP_STAGES`` deep; without it ``w_desc`` is unused (None). ``INT_DOT``
    (``GemvTiles.int_dot``): each step's products in integers instead of float16
    chains (``_int_pair_math``, ``_kernels_gemv_ints.py``: exact sums, inputs on a
    15-bit grid per column of 16). ``X_AHEAD`` (``GemvTiles.inputs_ahead``): each
    step's scales, zero points and inputs loaded a step ahead in registers, the words
    at their step (through the TMA pipeline where ``TMA``).
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
    acc, acc_up = _paired_loop(
        w_e, s_e, z_e, x_ptr, offs_n.to(tl.int64)[:, None],
        (offs_n + N).to(tl.int64)[:, None], n_mask, k_lo, k_hi, stride_wn, stride_sn,
        w_desc, row_tma, row_tma + N, GROUP, GATED, HAS_ZP, BLOCK_N, BLOCK_K, EVEN,
        PREFETCH, LOOP_STAGES, ASM, TMA, INT_DOT, X_AHEAD,
    )  # fmt: skip
    _gemv_store(
        tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), c_ptr, topk_weights_ptr, bias_ptr,
        p, e, tl.program_id(2), offs_n, n_mask, N, alpha, limit, stride_cs, stride_cm,
        stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
    )  # fmt: skip
