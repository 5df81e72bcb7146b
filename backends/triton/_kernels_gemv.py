# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Triton decode kernels: the pair-major int4 GEMV on bytes, and on 16-bit weights.

``@triton.jit`` only.

The typed host wrapper is ``launch_gemv`` in ``_launch_gemv.py``; names as in
``_kernels.py`` (``N`` output columns, ``K`` reduction, one program per routed pair
and column tile).
"""

import triton
import triton.language as tl

from backends.triton._kernels import _activate, _load_bias


@triton.jit
def _moe_gemv_kernel(
    # pointers
    a_ptr,
    b_ptr,
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
    # strides
    stride_am,
    stride_be,
    stride_bn,
    stride_se,
    stride_sn,
    stride_cs,
    stride_cm,
    stride_bias,
    # meta-parameters
    A_DIV: tl.constexpr,
    GROUP: tl.constexpr,
    NG: tl.constexpr,
    HAS_ZP: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    WEIGHT_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Decode path: one routed pair x ``BLOCK_N`` output columns, int4 weights, no dot.

    Grid: pairs x column tiles x K splits; split ``s`` reduces columns
    ``[s * k_per_split, (s + 1) * k_per_split)`` and writes ``C[s]`` (float32 partials
    summed by the top-k reduction; ungated only). ``HAS_BIAS`` adds ``bias[e, n]``
    (gated: and ``bias[e, n + N]`` to up) in split 0, after the router weight, as
    ``_moe_gemm_kernel`` does. ``PREFETCH`` loads step ``k + 1``'s bytes before step
    ``k``'s math; ``LOOP_STAGES`` asks Triton to pipeline the K loop (None: its
    default). Each packed byte of a used expert is read once per pair
    that routes to it, so this is chosen only when pairs rarely share an expert. The
    low and high nibbles, less the group's zero point, multiply the even and odd input
    columns in float32 (per code: ``sum(q x) - z sum(x)`` would cancel an outlier
    input against itself where ``q == z``, and make ``inf - inf`` of an infinite one)::

        e = ids[p]; if e < 0: return
        for k in 0..K step BLOCK_K (NG groups of BLOCK_K/NG columns):
            q_lo, q_hi = bytes[e, n, k/2 : (k+BLOCK_K)/2] & 15, >> 4
            dot[n, g] = sum((q_lo - z[n, g]) x_even + (q_hi - z[n, g]) x_odd)
            acc[n] += sum_g scale[n, g] * dot[n, g]
        acc = acc * topk_w[p] if WEIGHT_ROWS; acc += bias[e, n] if HAS_BIAS and s == 0
        C[s, p, n] = act(acc, acc_up) if gated else acc
    """
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    offs_n, n_mask, k_lo, k_hi, x_ptr, b_e, s_e, z_e = _gemv_tile(
        p, e, a_ptr, b_ptr, scale_ptr, zero_ptr, N, K, k_per_split, stride_am,
        stride_be, stride_se, A_DIV, BLOCK_N,
    )  # fmt: skip
    rows = offs_n.to(tl.int64)[:, None]
    pid_s = tl.program_id(2)
    GK: tl.constexpr = BLOCK_K // (2 * NG)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    up_rows = (offs_n + N).to(tl.int64)[:, None]
    offs_j0 = tl.arange(0, BLOCK_K // 2)
    nxt = 0  # the next step's bytes (PREFETCH only)
    nxt_up = 0
    if PREFETCH:  # the next step's bytes are loaded before this step's math
        first_j = k_lo // 2 + offs_j0
        first_mask = n_mask[:, None] & (first_j[None, :] < k_hi // 2)
        nxt = tl.load(
            b_e + rows * stride_bn + first_j[None, :], mask=first_mask, other=0
        )
        nxt_up = nxt
        if GATED:
            nxt_up = tl.load(
                b_e + up_rows * stride_bn + first_j[None, :], mask=first_mask, other=0
            )
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=LOOP_STAGES):
        offs_j = k0 // 2 + offs_j0
        j_mask = offs_j < k_hi // 2
        x_even3, x_odd3 = _step_inputs(x_ptr, offs_j, j_mask, NG, GK)
        offs_g = k0 // GROUP + tl.arange(0, NG)
        g_mask = n_mask[:, None] & (offs_g[None, :] < K // GROUP)
        packed, packed_up, nxt, nxt_up = _step_bytes(
            b_e, rows, up_rows, offs_j, j_mask, n_mask, k_hi, nxt, nxt_up, stride_bn,
            GATED, PREFETCH, BLOCK_K,
        )  # fmt: skip
        acc += _gemv_step(
            packed, x_even3, x_odd3, s_e, z_e,
            rows * stride_sn + offs_g[None, :], g_mask, HAS_ZP, BLOCK_N, NG, GK,
        )  # fmt: skip
        if GATED:
            acc_up += _gemv_step(
                packed_up, x_even3, x_odd3, s_e, z_e,
                up_rows * stride_sn + offs_g[None, :], g_mask, HAS_ZP, BLOCK_N, NG, GK,
            )  # fmt: skip
    _gemv_store(
        acc, acc_up, c_ptr, topk_weights_ptr, bias_ptr, p, e, pid_s, offs_n, n_mask,
        N, alpha, limit, stride_cs, stride_cm, stride_bias,
        GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _step_inputs(x_ptr, offs_j, j_mask, NG: tl.constexpr, GK: tl.constexpr):
    """A step's input: even and odd columns as ``[NG, GK]`` float32."""
    x_even = tl.load(x_ptr + 2 * offs_j, mask=j_mask, other=0.0).to(tl.float32)
    x_odd = tl.load(x_ptr + 2 * offs_j + 1, mask=j_mask, other=0.0).to(tl.float32)
    return tl.reshape(x_even, (NG, GK)), tl.reshape(x_odd, (NG, GK))


@triton.jit
def _step_bytes(
    b_e, rows, up_rows, offs_j, j_mask, n_mask, k_hi, nxt, nxt_up, stride_bn,
    GATED: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """A step's packed bytes ``[BLOCK_N, BLOCK_K / 2]`` (gated: and its up rows').

    Loaded here, or with ``PREFETCH`` the ones loaded a step ago (``nxt``, ``nxt_up``),
    the next step's then loaded in their place. Returns the step's bytes and the next.
    """
    if PREFETCH:
        packed = nxt
        packed_up = nxt_up
        offs_n2 = offs_j + BLOCK_K // 2
        m2 = n_mask[:, None] & (offs_n2[None, :] < k_hi // 2)
        nxt = tl.load(b_e + rows * stride_bn + offs_n2[None, :], mask=m2, other=0)
        if GATED:
            nxt_up = tl.load(
                b_e + up_rows * stride_bn + offs_n2[None, :], mask=m2, other=0
            )
    else:
        w_mask = n_mask[:, None] & j_mask[None, :]
        packed = tl.load(b_e + rows * stride_bn + offs_j[None, :], mask=w_mask, other=0)
        packed_up = packed
        if GATED:
            packed_up = tl.load(
                b_e + up_rows * stride_bn + offs_j[None, :], mask=w_mask, other=0
            )
    return packed, packed_up, nxt, nxt_up


@triton.jit
def _gemv_tile(
    p, e, a_ptr, w_ptr, scale_ptr, zero_ptr, N, K, k_per_split, stride_am, stride_we,
    stride_se, A_DIV: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """A GEMV program's rows, K range, and its pair's input and expert's bases.

    Returns the output rows of ``program_id(1)`` and their mask, the K range of split
    ``program_id(2)``, and pointers to pair ``p``'s input row and to expert ``e``'s
    weights, scales and zero points.
    """
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = scale_ptr + e.to(tl.int64) * stride_se
    z_e = zero_ptr + e.to(tl.int64) * stride_se
    return offs_n, offs_n < N, k_lo, k_hi, x_ptr, w_e, s_e, z_e


@triton.jit
def _gemv_store(
    acc, acc_up, c_ptr, topk_weights_ptr, bias_ptr, p, e, pid_s, offs_n, n_mask,
    N, alpha, limit, stride_cs, stride_cm, stride_bias,
    GATED: tl.constexpr, ACT: tl.constexpr, WEIGHT_ROWS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """The GEMVs' epilogue: ``C[s, p, n] = act(w acc + bias, w acc_up + bias_up)``.

    ``w`` is pair ``p``'s router weight with ``WEIGHT_ROWS`` (else 1); the bias
    (``HAS_BIAS``) is added in K split 0 only; ungated: ``acc`` (+ bias) as it is.
    """
    if WEIGHT_ROWS:
        rw = tl.load(topk_weights_ptr + p)
        acc = acc * rw
        acc_up = acc_up * rw
    if HAS_BIAS:  # after the input's router weight, in K split 0 only
        bias_e = bias_ptr + e.to(tl.int64) * stride_bias
        b, b_up = _load_bias(bias_e, offs_n, n_mask & (pid_s == 0), N, GATED)
        acc += b
        acc_up += b_up
    if GATED:
        acc = _activate(acc, acc_up, alpha, limit, ACT)
    c_ptrs = c_ptr + pid_s * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _gemv_step(
    packed,
    x_even3,
    x_odd3,
    s_e,
    z_e,
    g_offs,
    g_mask,
    HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NG: tl.constexpr,
    GK: tl.constexpr,
):
    """``sum_g scale[n, g] * sum_k (q[n, k] - z[n, g]) x[k]`` for one tile."""
    s = tl.load(s_e + g_offs, mask=g_mask, other=0.0).to(tl.float32)
    if HAS_ZP:
        z = tl.load(z_e + g_offs, mask=g_mask, other=0).to(tl.float32)
    else:
        z = tl.full([BLOCK_N, NG], 8.0, dtype=tl.float32)
    z3 = z[:, :, None]
    lo = tl.reshape((packed & 0xF).to(tl.float32), (BLOCK_N, NG, GK)) - z3
    hi = tl.reshape((packed >> 4).to(tl.float32), (BLOCK_N, NG, GK)) - z3
    dot = tl.sum(lo * x_even3[None, :, :] + hi * x_odd3[None, :, :], axis=2)
    return tl.sum(s * dot, axis=1)


@triton.jit
def _moe_gemv16_kernel(
    a_ptr, b_ptr, c_ptr, ids_ptr, topk_weights_ptr, bias_ptr,
    N, K, k_per_split, alpha, limit,
    stride_am, stride_be, stride_bn, stride_cs, stride_cm, stride_bias,
    A_DIV: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr,
    WEIGHT_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``_moe_gemv_kernel``'s contract on 16-bit weights (triton-emulation at decode).

    Grid, K splits, ``GATED``, ``WEIGHT_ROWS`` and ``HAS_BIAS`` as there::

        for each step: acc[n, k] += w[e, n, k] x[k]   (float32; gated: and up rows)
        C[s, p, n] = act(sum_k acc, sum_k acc_up) if gated else sum_k acc
    """
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None] * stride_bn
    up_rows = (offs_n + N).to(tl.int64)[:, None] * stride_bn
    pid_s = tl.program_id(2)
    k_lo = pid_s * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    b_e = b_ptr + e.to(tl.int64) * stride_be
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_hi
        x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        w_mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(b_e + rows + offs_k[None, :], mask=w_mask, other=0.0)
        acc += w.to(tl.float32) * x
        if GATED:
            w_up = tl.load(b_e + up_rows + offs_k[None, :], mask=w_mask, other=0.0)
            acc_up += w_up.to(tl.float32) * x
    _gemv_store(
        tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), c_ptr, topk_weights_ptr,
        bias_ptr, p, e, pid_s, offs_n, n_mask, N, alpha, limit, stride_cs, stride_cm,
        stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
    )  # fmt: skip
