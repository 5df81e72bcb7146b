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
def _load_weight_tile(
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
    INT4: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CT: tl.constexpr,
):
    """A ``(BLOCK_N, BLOCK_K)`` weight tile in dtype ``CT`` (dequantized if ``INT4``).

    ``b_ptr``, ``scale_ptr`` and ``zero_ptr`` already point at the expert. Int4 bytes
    hold element ``2j`` in the low nibble and ``2j+1`` in the high nibble.
    """
    rows = offs_n.to(tl.int64)[:, None]
    if INT4:
        offs_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        mask = n_mask[:, None] & (offs_p[None, :] < K // 2)
        packed = tl.load(b_ptr + rows * stride_bn + offs_p[None, :], mask=mask, other=0)
        lo = (packed & 0xF).to(tl.int32)
        hi = (packed >> 4).to(tl.int32)
        q = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K)).to(CT)
        if BLOCK_K <= GROUP:
            g_ptr = rows * stride_sn + k0 // GROUP
            s = tl.load(scale_ptr + g_ptr, mask=n_mask[:, None], other=0).to(CT)
            if HAS_ZP:
                z = tl.load(zero_ptr + g_ptr, mask=n_mask[:, None], other=0).to(CT)
            else:
                z = 8.0
            w = (q - z) * s
        else:
            NG: tl.constexpr = BLOCK_K // GROUP
            offs_g = k0 // GROUP + tl.arange(0, NG)
            g_mask = n_mask[:, None] & (offs_g[None, :] < K // GROUP)
            g_ptr = rows * stride_sn + offs_g[None, :]
            s = tl.load(scale_ptr + g_ptr, mask=g_mask, other=0).to(CT)
            q3 = tl.reshape(q, (BLOCK_N, NG, GROUP))
            if HAS_ZP:
                z = tl.load(zero_ptr + g_ptr, mask=g_mask, other=0).to(CT)
                q3 = q3 - z[:, :, None]
            else:
                q3 = q3 - 8.0
            w = tl.reshape(q3 * s[:, :, None], (BLOCK_N, BLOCK_K))
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = n_mask[:, None] & (offs_k[None, :] < K)
        w = tl.load(b_ptr + rows * stride_bn + offs_k[None, :], mask=mask, other=0)
    return w.to(CT)


@triton.jit
def _codes_minus(nibbles, OFFSET: tl.constexpr, CT: tl.constexpr):
    """``nibbles - OFFSET`` in dtype ``CT``, exactly.

    bf16 ``0x4300 | q`` is ``128 + q`` and fp16 ``0x6400 | q`` is ``1024 + q``: the
    codes become floats by bit pattern, with no conversion instruction. float32 (the
    interpreter) converts.
    """
    if CT == tl.bfloat16:  # noqa: SIM300 (CT is a constexpr)
        out = (nibbles.to(tl.uint16) | 0x4300).to(tl.bfloat16, bitcast=True)
        out = out - (128 + OFFSET)
    elif CT == tl.float16:  # noqa: SIM300
        out = (nibbles.to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True)
        out = out - (1024 + OFFSET)
    else:
        out = nibbles.to(tl.int32).to(CT) - OFFSET
    return out


@triton.jit
def _load_weight_halves(
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
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CT: tl.constexpr,
):
    """The even and the odd columns of an int4 ``(BLOCK_N, BLOCK_K)`` tile, dequantized.

    Each is ``(BLOCK_N, BLOCK_K // 2)``: the low and the high nibbles of the same bytes,
    so no register shuffle interleaves them (the activation is K-permuted to match).
    Scales (and zero points) are loaded 1-D per group column and broadcast, which lets
    Triton keep the tile in the layout of the dot's register operand.
    """
    HALF: tl.constexpr = BLOCK_K // 2
    rows = offs_n.to(tl.int64)
    offs_p = k0 // 2 + tl.arange(0, HALF)
    mask = n_mask[:, None] & (offs_p[None, :] < K // 2)
    packed = tl.load(
        b_ptr + rows[:, None] * stride_bn + offs_p[None, :], mask=mask, other=0
    )
    lo = _codes_minus(packed & 0xF, 0 if HAS_ZP else 8, CT)
    hi = _codes_minus(packed >> 4, 0 if HAS_ZP else 8, CT)
    if BLOCK_K <= GROUP:  # one group per row
        g_ptr = rows * stride_sn + k0 // GROUP
        s = tl.load(scale_ptr + g_ptr, mask=n_mask, other=0).to(CT)[:, None]
        if HAS_ZP:
            z = tl.load(zero_ptr + g_ptr, mask=n_mask, other=0).to(CT)[:, None]
            w_lo = (lo - z) * s
            w_hi = (hi - z) * s
        else:
            w_lo = lo * s
            w_hi = hi * s
    else:  # NG groups per row: column i of a half is in group k0/GROUP + i // (GROUP/2)
        NG: tl.constexpr = BLOCK_K // GROUP
        offs_g = k0 // GROUP + tl.arange(0, NG)
        g_mask = n_mask[:, None] & (offs_g[None, :] < K // GROUP)
        g_ptr = rows[:, None] * stride_sn + offs_g[None, :]
        s = tl.load(scale_ptr + g_ptr, mask=g_mask, other=0).to(CT)[:, :, None]
        lo3 = tl.reshape(lo, (BLOCK_N, NG, GROUP // 2))
        hi3 = tl.reshape(hi, (BLOCK_N, NG, GROUP // 2))
        if HAS_ZP:
            z = tl.load(zero_ptr + g_ptr, mask=g_mask, other=0).to(CT)[:, :, None]
            lo3 = lo3 - z
            hi3 = hi3 - z
        w_lo = tl.reshape(lo3 * s, (BLOCK_N, HALF))
        w_hi = tl.reshape(hi3 * s, (BLOCK_N, HALF))
    return w_lo.to(CT), w_hi.to(CT)


_WORD_ASM = """{
.reg .b32 t1, t2, t3, c0, c1, c2, c3, s2, b2, one, nz;
mov.b32 one, ONE;
mov.b32 nz, 0x80008000;
mov.b32 s2, {$9, $9};
mov.b32 b2, {$10, $10};
shr.u32 t1, $8, 4;
shr.u32 t2, $8, 8;
shr.u32 t3, $8, 12;
lop3.b32 c0, $8, 0x000f000f, MAGIC, 0xea;
lop3.b32 c1, t1, 0x000f000f, MAGIC, 0xea;
lop3.b32 c2, t2, 0x000f000f, MAGIC, 0xea;
lop3.b32 c3, t3, 0x000f000f, MAGIC, 0xea;
fma.rn.X2 c0, c0, one, b2;
fma.rn.X2 c1, c1, one, b2;
fma.rn.X2 c2, c2, one, b2;
fma.rn.X2 c3, c3, one, b2;
fma.rn.X2 c0, c0, s2, nz;
fma.rn.X2 c1, c1, s2, nz;
fma.rn.X2 c2, c2, s2, nz;
fma.rn.X2 c3, c3, s2, nz;
mov.b32 {$0, $4}, c0;
mov.b32 {$1, $5}, c1;
mov.b32 {$2, $6}, c2;
mov.b32 {$3, $7}, c3;
}"""
"""Eight codes of an int32 word to floats, ``(code - z) * s``, in 15 instructions.

``$8`` the word, ``$9`` the scale, ``$10`` the bias ``-(MAGIC_VALUE + z)``; ``$i``
(i < 8) receives nibble ``i``. A LOP3 puts nibbles ``i`` and ``i + 4`` under the
exponent bits ``MAGIC`` of a float pair (``128 + q`` in bf16, ``1024 + q`` in
fp16); the first FMA removes the bias exactly, the second scales with one rounding,
like ``(q - z) * s`` in the 16-bit dtype.
"""
_BF16_WORD_ASM = tl.constexpr(
    _WORD_ASM.replace("MAGIC", "0x43004300")
    .replace("ONE", "0x3f803f80")
    .replace("X2", "bf16x2")
)
_FP16_WORD_ASM = tl.constexpr(
    _WORD_ASM.replace("MAGIC", "0x64006400")
    .replace("ONE", "0x3c003c00")
    .replace("X2", "f16x2")
)


@triton.jit
def _nibble(words, i: tl.constexpr, z, s, CT: tl.constexpr):
    """``(q - z) * s`` of nibble ``i`` of each int32 word, in dtype ``CT``."""
    q = ((words >> (4 * i)) & 0xF).to(tl.int32).to(CT)
    return ((q - z) * s).to(CT)


@triton.jit
def _load_weight_words(
    b_ptr,
    scale_ptr,
    zero_ptr,
    offs_n,
    n_mask,
    k0,
    K_WORDS,
    stride_bn,
    stride_sn,
    GROUP: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CT: tl.constexpr,
    ASM: tl.constexpr,
):
    """An int4 ``(BLOCK_N, BLOCK_K)`` tile read as int32 words, dequantized, K in order.

    Each word holds 8 codes (element ``8w + i`` in nibble ``i``), so the loads are as
    wide as the blocked layout allows and one scale covers a word (``GROUP`` >= 8).
    The 8 nibble planes are dequantized (``ASM``: one inline-PTX block per word, else
    shifts and converts) and interleaved back with joins. Needs ``K % 8 == 0`` and a
    row stride of whole words (``launch_gemm`` checks).
    """
    NW: tl.constexpr = BLOCK_K // 8
    rows = offs_n.to(tl.int64)
    offs_w = tl.multiple_of(k0 // 8, NW) + tl.arange(0, NW)  # k0 % BLOCK_K == 0
    mask = n_mask[:, None] & (offs_w[None, :] < K_WORDS)
    w_ptr = b_ptr.to(tl.pointer_type(tl.int32))
    words = tl.load(
        w_ptr + rows[:, None] * (stride_bn // 4) + offs_w[None, :], mask=mask, other=0
    )
    if BLOCK_K <= GROUP:  # one group per row
        g_ptr = (rows * stride_sn + k0 // GROUP)[:, None]
        g_mask = n_mask[:, None]
    else:
        g_ptr = (
            rows[:, None] * stride_sn + ((k0 + 8 * tl.arange(0, NW)) // GROUP)[None, :]
        )
        g_mask = mask
    s = tl.load(scale_ptr + g_ptr, mask=g_mask, other=0).to(tl.float32)
    if HAS_ZP:
        z = tl.load(zero_ptr + g_ptr, mask=g_mask, other=0).to(tl.float32)
    else:
        z = tl.full(s.shape, 8.0, tl.float32)
    if ASM:
        s_b = tl.broadcast_to(s.to(CT), (BLOCK_N, NW))
        if CT == tl.bfloat16:  # noqa: SIM300 (CT is a constexpr)
            bias = tl.broadcast_to((-(z + 128.0)).to(CT), (BLOCK_N, NW))
            p0, p1, p2, p3, p4, p5, p6, p7 = tl.inline_asm_elementwise(
                _BF16_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, s_b, bias],
                dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1,
            )  # fmt: skip
        else:
            bias = tl.broadcast_to((-(z + 1024.0)).to(CT), (BLOCK_N, NW))
            p0, p1, p2, p3, p4, p5, p6, p7 = tl.inline_asm_elementwise(
                _FP16_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, s_b, bias],
                dtype=(tl.float16,) * 8, is_pure=True, pack=1,
            )  # fmt: skip
    else:
        s = s.to(CT)
        z = z.to(CT)
        p0 = _nibble(words, 0, z, s, CT)
        p1 = _nibble(words, 1, z, s, CT)
        p2 = _nibble(words, 2, z, s, CT)
        p3 = _nibble(words, 3, z, s, CT)
        p4 = _nibble(words, 4, z, s, CT)
        p5 = _nibble(words, 5, z, s, CT)
        p6 = _nibble(words, 6, z, s, CT)
        p7 = _nibble(words, 7, z, s, CT)
    evens = tl.join(tl.join(p0, p4), tl.join(p2, p6))  # [.., a, b] = plane 4a + 2b
    odds = tl.join(tl.join(p1, p5), tl.join(p3, p7))
    return tl.reshape(tl.join(evens, odds), (BLOCK_N, BLOCK_K))


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
):
    """One (row block, column tile, K split) of a grouped GEMM; see the module doc.

    ``GATED``: B rows ``n`` (gate) and ``n + N`` (up), output ``act(gate) * up``.
    ``WEIGHT_ROWS``: scale the rows by the router weight of their pair (the GEMM is
    linear, so this equals scaling the input). ``b_ptr`` holds experts
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
    HALF: tl.constexpr = BLOCK_K // 2
    for k0 in range(k_start, k_end, BLOCK_K):
        if KPERM:
            offs_h = tl.arange(0, HALF)
            a_mask = m_mask[:, None] & ((k0 // 2 + offs_h)[None, :] < k_end // 2)
            a_lo_ptrs = a_ptr + a_rows[:, None] * stride_am + (k0 + offs_h)[None, :]
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
        elif WORDS:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a_mask = m_mask[:, None] & (offs_k[None, :] < k_end)
            a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
            a = tl.load(a_ptrs, mask=a_mask, other=0).to(CT)
            w = _load_weight_words(
                b_e, s_e, z_e, offs_n, n_mask, k0, k_words, stride_bn, stride_sn,
                GROUP, HAS_ZP, BLOCK_N, BLOCK_K, CT, ASM,
            )  # fmt: skip
            acc = _dot(acc, a, w, SWAP_AB)
            if GATED:
                w_up = _load_weight_words(
                    b_e, s_e, z_e, offs_n + N, n_mask, k0, k_words, stride_bn,
                    stride_sn, GROUP, HAS_ZP, BLOCK_N, BLOCK_K, CT, ASM,
                )  # fmt: skip
                acc_up = _dot(acc_up, a, w_up, SWAP_AB)
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a_mask = m_mask[:, None] & (offs_k[None, :] < k_end)
            a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
            a = tl.load(a_ptrs, mask=a_mask, other=0).to(CT)
            w = _load_weight_tile(
                b_e, s_e, z_e, offs_n, n_mask, k0, K, stride_bn, stride_sn,
                GROUP, INT4, HAS_ZP, BLOCK_N, BLOCK_K, CT,
            )  # fmt: skip
            acc = _dot(acc, a, w, SWAP_AB)
            if GATED:
                w_up = _load_weight_tile(
                    b_e, s_e, z_e, offs_n + N, n_mask, k0, K, stride_bn, stride_sn,
                    GROUP, INT4, HAS_ZP, BLOCK_N, BLOCK_K, CT,
                )  # fmt: skip
                acc_up = _dot(acc_up, a, w_up, SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    if WEIGHT_ROWS:
        rw = tl.load(topk_weights_ptr + pairs, mask=m_mask, other=0.0)
        acc = acc * rw[:, None]
        acc_up = acc_up * rw[:, None]
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
