# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Triton kernels of the fused MoE: token alignment, grouped GEMMs, top-k reduction.

``@triton.jit`` functions only; the typed host wrappers live in ``_launch.py``.
GEMM names apply in this file: ``M`` rows (routed pairs grouped by expert), ``N``
output columns, ``K`` the reduction dimension (``K`` is D for w13 and F for w2);
top-k is ``TOP_K``. A pair ``p`` is token ``p // TOP_K``'s ``p % TOP_K``-th choice.

Blocked algorithm of ``_moe_gemm_kernel`` (grid: row blocks * column tiles, flattened
in the order ``_tile_of`` gives, x K splits)::

    e = block_expert[b]                               # -1: unused block of the grid
    if not lo <= e < hi: return                       # B holds experts lo..hi-1
    pairs = sorted_pairs[b*BLOCK_M : (b+1)*BLOCK_M]   # first block_rows[b] are valid
    for k in the K range of split s, step BLOCK_K:
        a = A[pairs // A_DIV, k : k+BLOCK_K]
        w = dequant(qdata[e, n, k/2], scale[e, n, k/G], zero[e, n, k/G])  # registers
        acc += a @ w.T                                 # (and acc_up for the gated GEMM)
    acc = acc * topk_w[pairs] if WEIGHT_ROWS; acc += bias[e, n] if HAS_BIAS and s == 0
    gated:   C[pairs, n] = act(acc) * acc_up           # w13 GEMM with the activation
    else:    C[s, pairs, n] = acc                      # w2 GEMM, partial per K split
"""

import triton
import triton.language as tl

from backends.triton._kernels_tiles import _load_weight_halves, _load_weight_in_order


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
    COUNT: tl.constexpr,
):
    """Place expert ``e``'s pairs in its ``BLOCK_M`` row blocks; one program per expert.

    The pairs per expert come from ``counts_ptr`` (``_count_experts_kernel``), or with
    ``COUNT`` each program counts every expert's pairs itself (a histogram of the
    ids; ``counts_ptr`` unused). Then it writes ``sorted[first*BLOCK_M + rank] = pair``
    (stable), ``block_expert`` and ``block_rows`` (valid rows) of the expert's blocks;
    program 0 marks the unused blocks after the last expert with ``-1``. Ids outside
    ``[0, num_experts)`` land in no block.
    """
    e = tl.program_id(0)
    offs_e = tl.arange(0, E_PAD)
    if COUNT:
        counts = tl.zeros([E_PAD], dtype=tl.int32)
        for start in range(0, num_pairs, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
            held = (ids >= 0) & (ids < num_experts)
            counts += tl.histogram(ids.to(tl.int32), E_PAD, mask=held)  # int32 bins
    else:
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
def _dot(acc, a, w, SWAP_AB: tl.constexpr):
    """``acc + a @ w.T``, or with ``SWAP_AB`` its transpose ``acc + w @ a.T``."""
    if SWAP_AB:  # noqa: SIM108 (a constexpr branch, resolved at compile time)
        out = tl.dot(w, tl.trans(a), acc)
    else:
        out = tl.dot(a, tl.trans(w), acc)
    return out


@triton.jit
def _activate(gate, up, alpha, limit, ACT: tl.constexpr):
    """``act(gate) * up`` in float32; ACT 0 silu, 1 gelu, 2 gelu_tanh, 3 swigluoai."""
    if ACT == 0:
        out = gate / (1.0 + tl.exp(-gate)) * up
    elif ACT == 1:
        out = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476)) * up
    elif ACT == 2:  # 0.5 * (1 + tanh(z)) is sigmoid(2z): no 1 - 1 in the tails
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = gate / (1.0 + tl.exp(-2.0 * inner)) * up
    else:  # NaN kept as torch's clamp keeps it (PTX min/max without .NaN drop it)
        nan: tl.constexpr = tl.PropagateNan.ALL
        g = tl.minimum(gate, limit, propagate_nan=nan)
        u = tl.minimum(
            tl.maximum(up, -limit, propagate_nan=nan), limit, propagate_nan=nan
        )
        out = (u + 1.0) * g / (1.0 + tl.exp(-alpha * g))
    return out


@triton.jit
def _load_bias(bias_e, offs_n, n_mask, N, GATED: tl.constexpr):
    """Float32 ``bias_e[n]`` and, when gated, ``bias_e[n + N]`` (else the first again)."""
    b = tl.load(bias_e + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    b_up = b
    if GATED:
        b_up = tl.load(bias_e + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    return b, b_up


@triton.jit
def _tile_of(pid, programs, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column tile) of program ``pid`` of the flattened grid.

    ``GROUP_M`` 0: row blocks vary fastest (all blocks of a column tile, then the
    next tile). Else programs walk ``GROUP_M`` row blocks by every column tile before
    the next ``GROUP_M`` blocks, so the rows a wave reads stay in L2.
    """
    tiles_n = tl.cdiv(N, BLOCK_N)
    blocks = programs // tiles_n
    if GROUP_M == 0:
        pid_b = pid % blocks
        pid_n = pid // blocks
    else:
        in_group = GROUP_M * tiles_n
        first = (pid // in_group) * GROUP_M
        size = tl.minimum(blocks - first, GROUP_M)
        pid_b = first + (pid % in_group) % size
        pid_n = (pid % in_group) // size
    return pid_b, pid_n


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
    bias_ptr,
    # sizes
    N,
    K,
    k_words,
    k_per_split,
    alpha,
    limit,
    expert_lo,
    expert_hi,
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
    INT4: tl.constexpr,
    HAS_ZP: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    WEIGHT_ROWS: tl.constexpr,
    CT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    KPERM: tl.constexpr,
    PERM_OUT: tl.constexpr,
    GROUP_M: tl.constexpr,
    WORDS: tl.constexpr,
    ASM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """One (row block, column tile, K split) of a grouped GEMM; see the module doc.

    ``GATED``: B rows ``n`` (gate) and ``n + N`` (up), output ``act(gate) * up``.
    ``WEIGHT_ROWS``: scale the rows by the router weight of their pair (the GEMM is
    linear, so this equals scaling the input). ``HAS_BIAS``: add ``bias[e, n]`` (and
    ``bias[e, n + N]`` to up) after that scaling, in K split 0 only. ``b_ptr`` holds experts
    ``expert_lo .. expert_hi - 1`` (a chunk of dequantized experts, or all of them).
    ``CT``: dtype of the dot operands, the
    activation dtype on the GPU and float32 in the interpreter, whose bf16 arithmetic
    is wrong (triton-lang/triton#11584).
    """
    pid_b, pid_n = _tile_of(tl.program_id(0), tl.num_programs(0), N, BLOCK_N, GROUP_M)
    pid_s = tl.program_id(2)
    e = tl.load(block_expert_ptr + pid_b)
    if e < expert_lo or e >= expert_hi:  # unused block (-1), or not in this chunk
        return
    n_rows = tl.load(block_rows_ptr + pid_b)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < n_rows
    pairs = tl.load(sorted_ptr + pid_b * BLOCK_M + offs_m, mask=m_mask, other=0)
    a_rows = (pairs // A_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    b_e = b_ptr + (e - expert_lo).to(tl.int64) * stride_be
    s_e = scale_ptr + e.to(tl.int64) * stride_se
    z_e = zero_ptr + e.to(tl.int64) * stride_se
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        if KPERM:
            acc, acc_up = _step_halves(
                acc, acc_up, a_ptr + a_rows[:, None] * stride_am, m_mask, b_e, s_e, z_e,
                offs_n, n_mask, k0, k_end, K, N, stride_bn, stride_sn, GROUP, HAS_ZP,
                GATED, BLOCK_N, BLOCK_K, CT, SWAP_AB,
            )  # fmt: skip
        else:
            acc, acc_up = _step_in_order(
                acc, acc_up, a_ptr + a_rows[:, None] * stride_am, m_mask, b_e, s_e, z_e,
                offs_n, n_mask, k0, k_end, K, N, k_words, stride_bn, stride_sn, GROUP,
                INT4, HAS_ZP, GATED, BLOCK_N, BLOCK_K, CT, WORDS, ASM, SWAP_AB,
            )  # fmt: skip
    if SWAP_AB:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    _store_rows(
        acc, acc_up, c_ptr, pairs, m_mask, offs_n, n_mask, topk_weights_ptr, bias_ptr,
        e, pid_s, N, alpha, limit, stride_cs, stride_cm, stride_bias, GATED, ACT,
        WEIGHT_ROWS, HAS_BIAS, PERM_OUT,
    )  # fmt: skip


@triton.jit
def _step_halves(
    acc, acc_up, a_rows_ptr, m_mask, b_e, s_e, z_e, offs_n, n_mask, k0, k_end, K, N,
    stride_bn, stride_sn, GROUP: tl.constexpr, HAS_ZP: tl.constexpr,
    GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    CT: tl.constexpr, SWAP_AB: tl.constexpr,
):  # fmt: skip
    """One ``KPERM`` step: the low and high nibbles dotted as two halves.

    ``a_rows_ptr``: ``[BLOCK_M, 1]`` pointers to the block's input rows, K-permuted in
    chunks of ``BLOCK_K`` (``permute_k``): columns ``k0 .. k0 + BLOCK_K / 2`` meet the
    low nibbles of the step, the next ``BLOCK_K / 2`` its high nibbles.
    """
    HALF: tl.constexpr = BLOCK_K // 2
    offs_h = tl.arange(0, HALF)
    a_mask = m_mask[:, None] & ((k0 // 2 + offs_h)[None, :] < k_end // 2)
    a_lo_ptrs = a_rows_ptr + (k0 + offs_h)[None, :]
    a_lo = tl.load(a_lo_ptrs, mask=a_mask, other=0).to(CT)
    a_hi = tl.load(a_lo_ptrs + HALF, mask=a_mask, other=0).to(CT)
    w_lo, w_hi = _load_weight_halves(
        b_e, s_e, z_e, offs_n, n_mask, k0, K, stride_bn, stride_sn,
        GROUP, HAS_ZP, BLOCK_N, BLOCK_K, CT,
    )  # fmt: skip
    acc = _dot(acc, a_lo, w_lo, SWAP_AB)
    acc = _dot(acc, a_hi, w_hi, SWAP_AB)
    if GATED:
        u_lo, u_hi = _load_weight_halves(
            b_e, s_e, z_e, offs_n + N, n_mask, k0, K, stride_bn, stride_sn,
            GROUP, HAS_ZP, BLOCK_N, BLOCK_K, CT,
        )  # fmt: skip
        acc_up = _dot(acc_up, a_lo, u_lo, SWAP_AB)
        acc_up = _dot(acc_up, a_hi, u_hi, SWAP_AB)
    return acc, acc_up


@triton.jit
def _step_in_order(
    acc, acc_up, a_rows_ptr, m_mask, b_e, s_e, z_e, offs_n, n_mask, k0, k_end, K, N,
    k_words, stride_bn, stride_sn, GROUP: tl.constexpr, INT4: tl.constexpr,
    HAS_ZP: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, CT: tl.constexpr, WORDS: tl.constexpr, ASM: tl.constexpr,
    SWAP_AB: tl.constexpr,
):  # fmt: skip
    """One step with K in order: bytes, int32 words, or 16-bit weights.

    ``a_rows_ptr``: ``[BLOCK_M, 1]`` pointers to the block's input rows.
    """
    offs_k = k0 + tl.arange(0, BLOCK_K)
    a_mask = m_mask[:, None] & (offs_k[None, :] < k_end)
    a = tl.load(a_rows_ptr + offs_k[None, :], mask=a_mask, other=0).to(CT)
    w = _load_weight_in_order(
        b_e, s_e, z_e, offs_n, n_mask, k0, K, k_words, stride_bn, stride_sn,
        GROUP, INT4, HAS_ZP, BLOCK_N, BLOCK_K, CT, WORDS, ASM,
    )  # fmt: skip
    acc = _dot(acc, a, w, SWAP_AB)
    if GATED:
        w_up = _load_weight_in_order(
            b_e, s_e, z_e, offs_n + N, n_mask, k0, K, k_words, stride_bn,
            stride_sn, GROUP, INT4, HAS_ZP, BLOCK_N, BLOCK_K, CT, WORDS, ASM,
        )  # fmt: skip
        acc_up = _dot(acc_up, a, w_up, SWAP_AB)
    return acc, acc_up


@triton.jit
def _store_rows(
    acc, acc_up, c_ptr, pairs, m_mask, offs_n, n_mask, topk_weights_ptr, bias_ptr, e,
    pid_s, N, alpha, limit, stride_cs, stride_cm, stride_bias, GATED: tl.constexpr,
    ACT: tl.constexpr, WEIGHT_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
    PERM_OUT: tl.constexpr,
):  # fmt: skip
    """The epilogue on ``acc[m, n]`` of expert ``e``, K split ``pid_s``.

    Router weights, the bias (the first K split only), the activation, and the store
    at each pair's row (columns K-permuted in chunks of ``PERM_OUT`` for a ``KPERM``
    GEMM that reads them next).
    """
    if WEIGHT_ROWS:
        rw = tl.load(topk_weights_ptr + pairs, mask=m_mask, other=0.0)
        acc = acc * rw[:, None]
        acc_up = acc_up * rw[:, None]
    if HAS_BIAS:
        bias_e = bias_ptr + e.to(tl.int64) * stride_bias
        b, b_up = _load_bias(bias_e, offs_n, n_mask & (pid_s == 0), N, GATED)
        acc += b[None, :]
        acc_up += b_up[None, :]
    if GATED:
        acc = _activate(acc, acc_up, alpha, limit, ACT)
    cols = offs_n
    if PERM_OUT > 0:  # the next GEMM reads this output K-permuted (see KPERM)
        i = offs_n % PERM_OUT
        cols = offs_n - i + (i % 2) * (PERM_OUT // 2) + i // 2
    c_ptrs = c_ptr + pid_s * stride_cs + pairs.to(tl.int64)[:, None] * stride_cm
    tl.store(
        c_ptrs + cols[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


@triton.jit
def _grid_dependency(WAIT: tl.constexpr, NEXT: tl.constexpr):
    """Programmatic dependent launch (sm_90+; ``GemvTiles.pdl``, ``MoETiles.pdl``).

    ``WAIT``: block until the kernel launched before this one has finished and its
    writes are visible (this kernel was launched with ``launch_pdl``, so it may start
    while that kernel still runs): every read of that kernel's outputs, and every
    write, must come after it. ``NEXT``: let the next kernel launch (if it was
    launched with ``launch_pdl``) once every program of this one has got here or
    exited. PTX ``griddepcontrol``; both are no-ops on a launch without PDL.
    """
    if WAIT:
        tl.inline_asm_elementwise(
            "griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False,
            pack=1,
        )  # fmt: skip
    if NEXT:
        tl.inline_asm_elementwise(
            "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip


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
    PDL: tl.constexpr,
):
    """``out[t] = sum over k, s of w[t, k] * part[s, t*TOP_K + k]``, skipping ids ``-1``.

    ``PDL``: launched with ``launch_pdl`` behind the w2 GEMV or GEMM; waits for it
    first.
    """
    _grid_dependency(PDL, NEXT=False)
    t = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        pair = t * TOP_K + k
        held = tl.load(ids_ptr + pair) >= 0
        row = tl.zeros([BLOCK_D], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            split_off = tl.full([], s, tl.int64) * stride_ps  # S * N * D may pass 2^31
            ptrs = part_ptr + split_off + pair.to(tl.int64) * stride_pm + offs_d
            row += tl.load(ptrs, mask=d_mask & held, other=0.0).to(tl.float32)
        if WEIGHTED:
            # masked too: a dropped pair's weight may be anything (NaN * 0 is NaN)
            row = row * tl.load(topk_weights_ptr + pair, mask=held, other=0.0)
        acc += row
    tl.store(
        out_ptr + t.to(tl.int64) * stride_om + offs_d,
        acc.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


@triton.jit
def _activate_splits_kernel(
    # pointers
    part_ptr,
    ids_ptr,
    out_ptr,
    # sizes
    F,
    alpha,
    limit,
    expert_lo,
    expert_hi,
    # strides
    stride_ps,
    stride_pm,
    stride_om,
    # meta-parameters
    ACT: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PDL: tl.constexpr,
):
    """``out[p, j] = act(gate) * up`` of the w13 GEMM's K-split partials.

    ``gate = sum over s of part[s, p, j]``, ``up`` the same at ``F + j``, for the
    pairs routed to experts ``expert_lo .. expert_hi - 1`` (those the GEMM just
    computed); the other pairs' rows (ids ``-1`` among them) are neither read nor
    written. One program per pair and column block. ``PDL`` (``MoETiles.pdl``):
    launched with ``launch_pdl`` behind the w13 GEMM; waits for it first, then lets
    the w2 GEMM launch.
    """
    _grid_dependency(WAIT=PDL, NEXT=PDL)
    pair = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    e = tl.load(ids_ptr + pair)
    mask = (offs < F) & (e >= expert_lo) & (e < expert_hi)
    row = part_ptr + pair.to(tl.int64) * stride_pm + offs
    gate = tl.zeros([BLOCK_F], dtype=tl.float32)
    up = tl.zeros([BLOCK_F], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        split_row = row + tl.full([], s, tl.int64) * stride_ps
        gate += tl.load(split_row, mask=mask, other=0.0)
        up += tl.load(split_row + F, mask=mask, other=0.0)
    out = _activate(gate, up, alpha, limit, ACT)
    tl.store(
        out_ptr + pair.to(tl.int64) * stride_om + offs,
        out.to(out_ptr.dtype.element_ty),
        mask=mask,
    )
