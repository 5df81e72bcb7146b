# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
"""The paired decode GEMV's loads (``_kernels_gemv_pairs.py``): words, scales, inputs.

``@triton.jit`` only. A step's words come as two ``[BLOCK_N, BLOCK_K / 16]`` tiles,
the two halves of each group's words, by TMA or plain loads (``_pair_words``); its
scales, zero points and 16 input planes by plain loads (``_pair_params``).
``_pair_loads`` reads a whole step, or with ``AHEAD`` a step's words with the next
step's rest (``GemvTiles.inputs_ahead``).
"""

import triton
import triton.language as tl

from backends.triton._kernels_gemv_words import _group_params, _x_plane


@triton.jit
def _tma_words(
    w_desc, row, k0, BLOCK_N: tl.constexpr, BW: tl.constexpr, HALF: tl.constexpr
):
    """A step's ``wa`` and ``wb`` tiles of ``BLOCK_N`` rows from ``row`` on, by TMA.

    ``w_desc`` views the words as ``[rows, K / 8]``, blocks ``[BLOCK_N, BW]`` (the
    step's whole rows, one bulk copy); the tile splits in registers into the first
    ``HALF`` words of each run of ``2 HALF`` (``wa``, ``_pair_loads``) and the second
    (``wb``). Rows past the tensor and words past ``K`` read zeros. (A 4-D view with a
    copy per half, ``HALF`` words a row, needed no split but ran 1.04-1.28x slower.)
    """
    row = tl.cast(row, tl.int32)  # descriptor offsets are int32
    col = tl.cast(k0 // 8, tl.int32)
    w = w_desc.load([row, col])
    w = tl.reshape(w, [BLOCK_N, BW // (2 * HALF), 2, HALF])
    w = tl.permute(w, (0, 1, 3, 2))
    wa, wb = tl.split(tl.reshape(w, [BLOCK_N, BW // 2, 2]))
    return wa, wb


@triton.jit
def _pair_cols(
    offs_i, n_mask, k0, k_hi,
    GROUP: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    """A step's word columns ``wa``, ``wb`` (``_pair_loads``) and their masks.

    Returns ``wa``, ``wb``, the input masks of each, the words' masks (rows too), the
    scales' group columns and mask. ``PREFETCH``: everything masked off where
    ``k0 >= k_hi`` (the step a loop loading ahead asks for after its last).
    """
    BW: tl.constexpr = BLOCK_K // 8
    WG: tl.constexpr = GROUP // 8
    HALF: tl.constexpr = BW // 2 if BLOCK_K <= GROUP else WG // 2
    wa = tl.multiple_of(k0 // 8, BW) + (offs_i // HALF) * (2 * HALF) + offs_i % HALF
    wb = wa + HALF
    row_mask = n_mask[:, None]
    if PREFETCH:
        row_mask = row_mask & (k0 < k_hi)
    if EVEN:
        a_mask = offs_i < BW // 2
        if PREFETCH:
            a_mask = a_mask & (k0 < k_hi)
        b_mask = a_mask
        wa_mask = row_mask
        wb_mask = row_mask
    else:
        a_mask = wa < k_hi // 8
        b_mask = wb < k_hi // 8
        wa_mask = row_mask & a_mask[None, :]
        wb_mask = row_mask & b_mask[None, :]
    if BLOCK_K <= GROUP:  # one group per step
        g_col = tl.zeros([1, 1], dtype=tl.int32) + k0 // GROUP
        s_mask = row_mask
    else:
        g_col = (wa // WG)[None, :]
        s_mask = wa_mask
    return wa, wb, a_mask, b_mask, wa_mask, wb_mask, g_col, s_mask


@triton.jit
def _pair_words(
    w_e, rows, up_rows, wa, wb, wa_mask, wb_mask, k0, stride_wn, w_desc, row_tma,
    up_tma, BN: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
    GATED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """A step's words (a, b; up a, up b: the gate's without ``GATED``).

    By TMA (``_tma_words``, unmasked) or plain masked loads at ``wa`` / ``wb``.
    """
    BW: tl.constexpr = BLOCK_K // 8
    HALF: tl.constexpr = BW // 2 if BLOCK_K <= GROUP else GROUP // 16
    if TMA:
        words_a, words_b = _tma_words(w_desc, row_tma, k0, BN, BW, HALF)
    else:
        words_a = tl.load(w_e + rows * stride_wn + wa[None, :], mask=wa_mask, other=0)
        words_b = tl.load(w_e + rows * stride_wn + wb[None, :], mask=wb_mask, other=0)
    up_a = words_a
    up_b = words_b
    if GATED:
        if TMA:
            up_a, up_b = _tma_words(w_desc, up_tma, k0, BN, BW, HALF)
        else:
            up_a = tl.load(
                w_e + up_rows * stride_wn + wa[None, :], mask=wa_mask, other=0
            )
            up_b = tl.load(
                w_e + up_rows * stride_wn + wb[None, :], mask=wb_mask, other=0
            )
    return words_a, words_b, up_a, up_b


@triton.jit
def _pair_params(
    s_e, z_e, x_ptr, rows, up_rows, wa, wb, a_mask, b_mask, g_col, s_mask, stride_sn,
    GATED: tl.constexpr, HAS_ZP: tl.constexpr, RAW: tl.constexpr,
):  # fmt: skip
    """A step's scales and zero points (gate, up) and its 16 input planes (a, then b).

    The planes in float32, or as loaded with ``RAW`` (``_f32_planes`` converts them).
    """
    s, z = _group_params(s_e, z_e, rows, g_col, s_mask, stride_sn, HAS_ZP)
    s_up = s
    z_up = z
    if GATED:
        s_up, z_up = _group_params(s_e, z_e, up_rows, g_col, s_mask, stride_sn, HAS_ZP)
    return (
        s, s_up, z, z_up,
        _plane(x_ptr, wa, a_mask, 0, RAW), _plane(x_ptr, wa, a_mask, 1, RAW),
        _plane(x_ptr, wa, a_mask, 2, RAW), _plane(x_ptr, wa, a_mask, 3, RAW),
        _plane(x_ptr, wa, a_mask, 4, RAW), _plane(x_ptr, wa, a_mask, 5, RAW),
        _plane(x_ptr, wa, a_mask, 6, RAW), _plane(x_ptr, wa, a_mask, 7, RAW),
        _plane(x_ptr, wb, b_mask, 0, RAW), _plane(x_ptr, wb, b_mask, 1, RAW),
        _plane(x_ptr, wb, b_mask, 2, RAW), _plane(x_ptr, wb, b_mask, 3, RAW),
        _plane(x_ptr, wb, b_mask, 4, RAW), _plane(x_ptr, wb, b_mask, 5, RAW),
        _plane(x_ptr, wb, b_mask, 6, RAW), _plane(x_ptr, wb, b_mask, 7, RAW),
    )  # fmt: skip


@triton.jit
def _plane(x_ptr, wi, i_mask, j: tl.constexpr, RAW: tl.constexpr):
    """``x[8 wi + j]``: ``_x_plane``, or in the input's dtype with ``RAW``."""
    if RAW:
        x = tl.load(x_ptr + 8 * wi + j, mask=i_mask, other=0.0)
    else:
        x = _x_plane(x_ptr, wi, i_mask, j)
    return x


@triton.jit
def _f32_planes(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    """The 16 planes of ``_pair_params(RAW=True)`` in float32 (exact)."""
    f = tl.float32
    return (
        a0.to(f), a1.to(f), a2.to(f), a3.to(f), a4.to(f), a5.to(f), a6.to(f), a7.to(f),
        b0.to(f), b1.to(f), b2.to(f), b3.to(f), b4.to(f), b5.to(f), b6.to(f), b7.to(f),
    )  # fmt: skip


@triton.jit
def _pair_loads(
    w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k0, k_hi, stride_wn, stride_sn,
    w_desc, row_tma, up_tma,
    GROUP: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    GATED: tl.constexpr, HAS_ZP: tl.constexpr, PREFETCH: tl.constexpr,
    TMA: tl.constexpr, AHEAD: tl.constexpr,
):  # fmt: skip
    """``_word_loads`` of the paired kernel: a step's words as two ``[BN, BW / 2]`` tiles.

    Element ``i`` of the two is word ``wa(i)`` and ``wa(i) + HALF`` of the step, the
    two halves of one group's (or, steps within a group, of the step's) words::

        HALF = BW / 2 if BLOCK_K <= GROUP else GROUP / 16
        wa(i) = (i // HALF) * 2 HALF + i % HALF

    ``TMA``: the words come through ``w_desc`` (``_tma_words``; rows ``row_tma`` and
    ``up_tma`` of its first dimension), unmasked: rows past ``N`` are dropped at the
    store, and words past ``k_hi`` meet zero inputs (the input planes keep their
    masks). Returns the words (a, b; up a, up b), scales and zero points (gate, up;
    one per element, shared by a and b) and the 8 input planes of a, then of b
    (``_pair_words``, then ``_pair_params``). ``AHEAD`` (``X_AHEAD``'s loads, with
    ``PREFETCH`` off): the words of step ``k0``, the rest of step ``k0 + BLOCK_K``,
    masked off past ``k_hi``, its planes as loaded (``RAW``).
    """
    wa, wb, a_mask, b_mask, wa_mask, wb_mask, g_col, s_mask = _pair_cols(
        offs_i, n_mask, k0, k_hi, GROUP, BLOCK_K, EVEN, PREFETCH
    )
    BN: tl.constexpr = n_mask.shape[0]
    words_a, words_b, up_a, up_b = _pair_words(
        w_e, rows, up_rows, wa, wb, wa_mask, wb_mask, k0, stride_wn, w_desc, row_tma,
        up_tma, BN, GROUP, BLOCK_K, GATED, TMA,
    )  # fmt: skip
    if AHEAD:
        wa, wb, a_mask, b_mask, wa_mask, wb_mask, g_col, s_mask = _pair_cols(
            offs_i, n_mask, k0 + BLOCK_K, k_hi, GROUP, BLOCK_K, EVEN, PREFETCH=True
        )
    (s, s_up, z, z_up, a0, a1, a2, a3, a4, a5, a6, a7,
     b0, b1, b2, b3, b4, b5, b6, b7) = _pair_params(
        s_e, z_e, x_ptr, rows, up_rows, wa, wb, a_mask, b_mask, g_col, s_mask,
        stride_sn, GATED, HAS_ZP, AHEAD,
    )  # fmt: skip
    return (
        words_a, words_b, up_a, up_b, s, s_up, z, z_up, a0, a1, a2, a3, a4, a5, a6, a7,
        b0, b1, b2, b3, b4, b5, b6, b7,
    )  # fmt: skip
