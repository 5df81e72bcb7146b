"""Triton kernels of the fused MoE: token alignment, grouped GEMMs, top-k reduction.

``@triton.jit`` functions only; the typed host wrappers live in ``_launch.py``.
GEMM names apply in this file: ``M`` rows (routed pairs grouped by expert), ``N``
output columns, ``K`` the reduction dimension (``K`` is D for w13 and F for w2);
top-k is ``TOP_K``. A pair ``p`` is token ``p // TOP_K``'s ``p % TOP_K``-th choice.

Blocked algorithm of ``_moe_gemm_kernel`` (grid: row blocks x column tiles x K splits)::

    e = block_expert[b]; if e < 0: return            # unused block of the padded grid
    pairs = sorted_pairs[b*BLOCK_M : (b+1)*BLOCK_M]   # first block_rows[b] are valid
    for k in the K range of split s, step BLOCK_K:
        a = A[pairs // A_DIV, k : k+BLOCK_K]
        lo, hi = dequant(qdata[e, n, k/2] low / high nibbles, zero)   # registers
        acc += (a[:, even k] @ lo.T + a[:, odd k] @ hi.T) * scale[e, n, k/G]
    gated:   C[pairs, n] = act(acc) * acc_up           # w13 GEMM with the activation
    else:    C[s, pairs, n] = acc                      # w2 GEMM, partial per K split
"""

import triton
import triton.language as tl


@triton.jit
def _count_experts_kernel(ids_ptr, counts_ptr, num_pairs, BLOCK: tl.constexpr):
    """``counts[e]`` = routed pairs whose id is ``e``; one program per expert."""
    e = tl.program_id(0)
    hits = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
        hits += (ids == e).to(tl.int32)
    tl.store(counts_ptr + e, tl.sum(hits, axis=0))


@triton.jit
def _align_blocks_kernel(
    # pointers
    ids_ptr,
    counts_ptr,
    sorted_ptr,
    block_expert_ptr,
    block_rows_ptr,
    # sizes
    num_pairs,
    num_experts,
    max_blocks,
    # meta-parameters
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
    E_PAD: tl.constexpr,
):
    """Place expert ``e``'s pairs in its ``BLOCK_M`` row blocks; one program per expert.

    Writes ``sorted[first*BLOCK_M + rank] = pair`` (stable), ``block_expert`` and
    ``block_rows`` (valid rows) of the expert's blocks; program 0 marks the unused
    blocks after the last expert with ``-1``.
    """
    e = tl.program_id(0)
    offs_e = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + offs_e, mask=offs_e < num_experts, other=0)
    nblocks = (counts + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(nblocks, axis=0)
    my_count = tl.sum(tl.where(offs_e == e, counts, 0), axis=0)
    my_blocks = (my_count + BLOCK_M - 1) // BLOCK_M
    first = tl.sum(tl.where(offs_e == e, ends, 0), axis=0) - my_blocks
    running = tl.zeros([], dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
        hit = (ids == e).to(tl.int32)
        rank = running + tl.cumsum(hit, axis=0) - 1
        tl.store(sorted_ptr + first * BLOCK_M + rank, offs, mask=hit == 1)
        running += tl.sum(hit, axis=0)
    for j in range(0, my_blocks, BLOCK):
        jb = j + tl.arange(0, BLOCK)
        keep = jb < my_blocks
        rows = tl.minimum(my_count - jb * BLOCK_M, BLOCK_M)
        tl.store(block_expert_ptr + first + jb, tl.zeros_like(jb) + e, mask=keep)
        tl.store(block_rows_ptr + first + jb, rows, mask=keep)
    if e == 0:
        for start in range(tl.sum(nblocks, axis=0), max_blocks, BLOCK):
            jb = start + tl.arange(0, BLOCK)
            keep = jb < max_blocks
            tl.store(block_expert_ptr + jb, tl.zeros_like(jb) - 1, mask=keep)
            tl.store(block_rows_ptr + jb, tl.zeros_like(jb), mask=keep)


@triton.jit
def _int4_halves(
    b_ptr,
    scale_ptr,
    zero_ptr,
    offs_n,
    n_mask,
    k0,
    K,
    stride_bn,
    stride_sn,
    GROUP: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CT: tl.constexpr,
    MAGIC: tl.constexpr,
    MAGIC_BITS: tl.constexpr,
):
    """Dequantized ``(BLOCK_N, BLOCK_K/2)`` tiles of the even-k (low nibble) and odd-k
    (high nibble) weights, and the scale.

    Splitting by nibble avoids interleaving registers: the caller dots the even and odd
    columns of A with each half. When a tile lies in one group (``BLOCK_K <= GROUP``)
    the halves hold ``q - z`` (exact) and the ``(BLOCK_N, 1)`` scale is applied after
    the dot; otherwise the halves are scaled here. On the GPU, ``q | MAGIC_BITS``
    reinterpreted as a 16-bit float is ``MAGIC + q`` (no int-to-float conversion).
    """
    rows = offs_n.to(tl.int64)[:, None]
    offs_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    mask = n_mask[:, None] & (offs_p[None, :] < K // 2)
    packed = tl.load(b_ptr + rows * stride_bn + offs_p[None, :], mask=mask, other=0)
    packed = packed.to(tl.int32)
    if BLOCK_K <= GROUP:
        g_off = rows * stride_sn + k0 // GROUP
        g_mask = n_mask[:, None]
    else:
        g_off = rows * stride_sn + (2 * offs_p[None, :]) // GROUP
        g_mask = mask
    if HAS_ZP:
        z = tl.load(zero_ptr + g_off, mask=g_mask, other=0).to(tl.float32)
    else:
        z = tl.zeros(g_off.shape, dtype=tl.float32) + 8.0
    bias = (z + MAGIC).to(CT)
    if MAGIC > 0:
        lo = ((packed & 0xF) | MAGIC_BITS).to(tl.int16).to(CT, bitcast=True) - bias
        hi = ((packed >> 4) | MAGIC_BITS).to(tl.int16).to(CT, bitcast=True) - bias
    else:
        lo = (packed & 0xF).to(CT) - bias
        hi = (packed >> 4).to(CT) - bias
    s = tl.load(scale_ptr + g_off, mask=g_mask, other=0).to(CT)
    if BLOCK_K > GROUP:
        lo = lo * s
        hi = hi * s
    return lo, hi, s


@triton.jit
def _dot_int4(
    a_even, a_odd, lo, hi, s, acc, BLOCK_K: tl.constexpr, GROUP: tl.constexpr
):
    """``acc + a @ w.T`` from the nibble halves of ``_int4_halves``."""
    if BLOCK_K <= GROUP:
        part = tl.dot(a_even, tl.trans(lo))
        part = tl.dot(a_odd, tl.trans(hi), part)
        acc += part * tl.trans(s).to(tl.float32)
    else:
        acc = tl.dot(a_even, tl.trans(lo), acc)
        acc = tl.dot(a_odd, tl.trans(hi), acc)
    return acc


@triton.jit
def _dense_step(
    a_ptrs,
    a_mask,
    b_ptr,
    offs_n,
    n_mask,
    k0,
    K,
    stride_bn,
    acc,
    BLOCK_K: tl.constexpr,
    CT: tl.constexpr,
):
    """``acc + a @ w.T`` for 16-bit weights ``(BLOCK_N, BLOCK_K)``."""
    a = tl.load(a_ptrs, mask=a_mask, other=0).to(CT)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = n_mask[:, None] & (offs_k[None, :] < K)
    rows = offs_n.to(tl.int64)[:, None]
    w = tl.load(b_ptr + rows * stride_bn + offs_k[None, :], mask=mask, other=0).to(CT)
    return tl.dot(a, tl.trans(w), acc)


@triton.jit
def _activate(gate, up, alpha, limit, ACT: tl.constexpr):
    """``act(gate) * up`` in float32; ACT 0 silu, 1 gelu, 2 gelu_tanh, 3 swigluoai."""
    if ACT == 0:
        out = gate / (1.0 + tl.exp(-gate)) * up
    elif ACT == 1:
        out = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476)) * up
    elif ACT == 2:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        tanh = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
        out = 0.5 * gate * (1.0 + tanh) * up
    else:
        g = tl.minimum(gate, limit)
        u = tl.minimum(tl.maximum(up, -limit), limit)
        out = (u + 1.0) * g / (1.0 + tl.exp(-alpha * g))
    return out


@triton.jit
def _moe_gemm_kernel(
    # pointers
    a_ptr,
    b_ptr,
    scale_ptr,
    zero_ptr,
    c_ptr,
    sorted_ptr,
    block_expert_ptr,
    block_rows_ptr,
    topk_weights_ptr,
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
    # meta-parameters
    A_DIV: tl.constexpr,
    GROUP: tl.constexpr,
    INT4: tl.constexpr,
    HAS_ZP: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    WEIGHT_ROWS: tl.constexpr,
    CT: tl.constexpr,
    MAGIC: tl.constexpr,
    MAGIC_BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One (row block, column tile, K split) of a grouped GEMM; see the module doc.

    ``GATED``: B rows ``n`` (gate) and ``n + N`` (up), output ``act(gate) * up``.
    ``WEIGHT_ROWS``: scale the rows by the router weight of their pair (the GEMM is
    linear, so this equals scaling the input). ``CT``: dtype of the dot operands, the
    activation dtype on the GPU and float32 in the interpreter, whose bf16 arithmetic
    is wrong (triton-lang/triton#11584).
    """
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    e = tl.load(block_expert_ptr + pid_b)
    if e < 0:
        return
    n_rows = tl.load(block_rows_ptr + pid_b)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < n_rows
    pairs = tl.load(sorted_ptr + pid_b * BLOCK_M + offs_m, mask=m_mask, other=0)
    a_rows = (pairs // A_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    b_e = b_ptr + e.to(tl.int64) * stride_be
    s_e = scale_ptr + e.to(tl.int64) * stride_se
    z_e = zero_ptr + e.to(tl.int64) * stride_se
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        if INT4:
            offs_h = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            h_mask = m_mask[:, None] & (2 * offs_h[None, :] < k_end)
            a_even_ptrs = a_ptr + a_rows[:, None] * stride_am + 2 * offs_h[None, :]
            a_even = tl.load(a_even_ptrs, mask=h_mask, other=0).to(CT)
            a_odd = tl.load(a_even_ptrs + 1, mask=h_mask, other=0).to(CT)
            lo, hi, s = _int4_halves(
                b_e,
                s_e,
                z_e,
                offs_n,
                n_mask,
                k0,
                K,
                stride_bn,
                stride_sn,
                GROUP,
                HAS_ZP,
                BLOCK_K,
                CT,
                MAGIC,
                MAGIC_BITS,
            )
            acc = _dot_int4(a_even, a_odd, lo, hi, s, acc, BLOCK_K, GROUP)
            if GATED:
                lo, hi, s = _int4_halves(
                    b_e,
                    s_e,
                    z_e,
                    offs_n + N,
                    n_mask,
                    k0,
                    K,
                    stride_bn,
                    stride_sn,
                    GROUP,
                    HAS_ZP,
                    BLOCK_K,
                    CT,
                    MAGIC,
                    MAGIC_BITS,
                )
                acc_up = _dot_int4(a_even, a_odd, lo, hi, s, acc_up, BLOCK_K, GROUP)
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a_mask = m_mask[:, None] & (offs_k[None, :] < k_end)
            a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
            acc = _dense_step(
                a_ptrs, a_mask, b_e, offs_n, n_mask, k0, K, stride_bn, acc, BLOCK_K, CT
            )
            if GATED:
                acc_up = _dense_step(
                    a_ptrs,
                    a_mask,
                    b_e,
                    offs_n + N,
                    n_mask,
                    k0,
                    K,
                    stride_bn,
                    acc_up,
                    BLOCK_K,
                    CT,
                )
    if WEIGHT_ROWS:
        rw = tl.load(topk_weights_ptr + pairs, mask=m_mask, other=0.0)
        acc = acc * rw[:, None]
        acc_up = acc_up * rw[:, None]
    if GATED:
        acc = _activate(acc, acc_up, alpha, limit, ACT)
    c_ptrs = c_ptr + pid_s * stride_cs + pairs.to(tl.int64)[:, None] * stride_cm
    tl.store(
        c_ptrs + offs_n[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


@triton.jit
def _reduce_topk_kernel(
    # pointers
    part_ptr,
    ids_ptr,
    topk_weights_ptr,
    out_ptr,
    # sizes
    D,
    # strides
    stride_ps,
    stride_pm,
    stride_om,
    # meta-parameters
    TOP_K: tl.constexpr,
    SPLIT: tl.constexpr,
    WEIGHTED: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """``out[t] = sum over k, s of w[t, k] * part[s, t*TOP_K + k]``, skipping ids ``-1``."""
    t = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        pair = t * TOP_K + k
        held = tl.load(ids_ptr + pair) >= 0
        row = tl.zeros([BLOCK_D], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            ptrs = part_ptr + s * stride_ps + pair.to(tl.int64) * stride_pm + offs_d
            row += tl.load(ptrs, mask=d_mask & held, other=0.0).to(tl.float32)
        if WEIGHTED:
            row = row * tl.load(topk_weights_ptr + pair)
        acc += row
    tl.store(
        out_ptr + t.to(tl.int64) * stride_om + offs_d,
        acc.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )
