"""Triton decode kernel of triton-w4a16: the w2 GEMV summing each token's top-k pairs.

``@triton.jit`` only; the typed host wrapper is ``launch_gemv_topk`` in ``_launch.py``
(``GemvTiles.topk_fused``). The paired kernel's math (``_kernels_gemv_pairs.py``) in a
token-major grid: one program per token and row tile walks its token's ``TOP_K`` pairs
one after the other, each pair's K steps in turn, in one flat loop (so the TMA
pipeline runs across pair boundaries), and sums them, router-weighted, in float32: no
per-pair partials and no top-k launch.
"""

import triton
import triton.language as tl

from backends.triton._kernels import _grid_dependency
from backends.triton._kernels_gemv_pairs import _pair_loads, _pair_scale, _pair_step


@triton.jit
def _held(x, held):
    """``x`` where the pair is held here, else 0 (its input row was never written)."""
    return tl.where(held, x, 0.0)


@triton.jit
def _moe_gemv_topk_kernel(
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
    # strides (w in int32 words)
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_cm,
    stride_bias,
    # meta-parameters
    TOP_K: tl.constexpr,
    WEIGHTED: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    ASM: tl.constexpr,
    PDL_WAIT: tl.constexpr,
    TMA: tl.constexpr,
):
    """``C[t, n] = sum_k w[t, k] (sum_j W2[e_k, n, j] inter[t K + k, j] + bias[e_k, n])``.

    Grid: tokens x column tiles. ``w[t, k]`` is the router weight with ``WEIGHTED``
    (else 1); pairs of id ``-1`` contribute zero (their ``inter`` rows are never
    written: their inputs are replaced by zeros, their words read from expert 0).
    Loop ``j`` over ``TOP_K * steps``: pair ``k = j // steps``, step ``j % steps`` of
    ``BLOCK_K`` columns; each step is the paired kernel's (``_pair_loads``,
    ``_pair_step``) with the router weight folded into its power-of-two scale, so the
    token's sum stays in float32 to the end (the pair-major path rounds each pair's
    output to the buffer dtype before the top-k sum). ``PDL_WAIT``: wait for the w13
    GEMV before reading anything it wrote (``_grid_dependency``).
    """
    t = tl.program_id(0)
    _grid_dependency(PDL_WAIT, False)  # noqa: FBT003 (nothing launched after waits)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None]
    BH: tl.constexpr = BLOCK_K // 16
    offs_i = tl.arange(0, BH)
    acc = tl.zeros([BLOCK_N, BH], dtype=tl.float32)
    steps = tl.cdiv(K, BLOCK_K)
    rows_per_expert = stride_we // stride_wn
    for j in tl.range(0, TOP_K * steps, num_stages=LOOP_STAGES):
        k = j // steps
        k0 = (j - k * steps) * BLOCK_K
        p = t * TOP_K + k
        e = tl.load(ids_ptr + p)
        held = e >= 0
        e = tl.maximum(e, 0)
        w_e = w_ptr + e.to(tl.int64) * stride_we
        s_e = scale_ptr + e.to(tl.int64) * stride_se
        z_e = zero_ptr + e.to(tl.int64) * stride_se
        x_ptr = a_ptr + p.to(tl.int64) * stride_am
        row_tma = e * rows_per_expert + tl.program_id(1) * BLOCK_N
        (wa, wb, _, _, s, _, z, _, a0, a1, a2, a3, a4, a5, a6, a7,
         b0, b1, b2, b3, b4, b5, b6, b7) = _pair_loads(
            w_e, s_e, z_e, x_ptr, rows, rows, n_mask, offs_i, k0, K, stride_wn,
            stride_sn, w_desc, row_tma, row_tma, GROUP, BLOCK_K, EVEN,
            False, HAS_ZP, False, TMA,  # noqa: FBT003 (ungated, no prefetch)
        )  # fmt: skip
        a0, a1, a2, a3 = (
            _held(a0, held),
            _held(a1, held),
            _held(a2, held),
            _held(a3, held),
        )
        a4, a5, a6, a7 = (
            _held(a4, held),
            _held(a5, held),
            _held(a6, held),
            _held(a7, held),
        )
        b0, b1, b2, b3 = (
            _held(b0, held),
            _held(b1, held),
            _held(b2, held),
            _held(b3, held),
        )
        b4, b5, b6, b7 = (
            _held(b4, held),
            _held(b5, held),
            _held(b6, held),
            _held(b7, held),
        )
        pw, inv = _pair_scale(a0, a1, a2, a3, a4, a5, a6, a7,
                              b0, b1, b2, b3, b4, b5, b6, b7)  # fmt: skip
        if WEIGHTED:
            pw = pw * tl.load(topk_weights_ptr + p)
        acc += _pair_step(
            wa, wb, s, z, pw, a0 * inv, a1 * inv, a2 * inv, a3 * inv, a4 * inv,
            a5 * inv, a6 * inv, a7 * inv, b0 * inv, b1 * inv, b2 * inv, b3 * inv,
            b4 * inv, b5 * inv, b6 * inv, b7 * inv, ASM,
        )  # fmt: skip
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        for k in tl.static_range(TOP_K):
            p = t * TOP_K + k
            e = tl.load(ids_ptr + p)
            held = e >= 0
            bias_e = bias_ptr + tl.maximum(e, 0).to(tl.int64) * stride_bias
            b = tl.load(bias_e + offs_n, mask=n_mask & held, other=0.0).to(tl.float32)
            if WEIGHTED:
                b = b * tl.load(topk_weights_ptr + p)
            out += b
    c_ptrs = c_ptr + t.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=n_mask)
