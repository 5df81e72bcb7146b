# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Gluon kernel of the decode GEMM: int4 words dequantized into the MMA's register operand.

``_moe_gemm_mma_kernel`` computes what ``_moe_gemm_kernel`` computes with swapped
operands and int32 words (same arguments, same outputs), but is written in Triton's
Gluon dialect, where every tensor's register layout is stated. The point: each
thread loads exactly the words whose codes it holds in the tensor-core instruction's
A fragment (``mma.sync`` m16n8k16), so the dequantized tile feeds the MMA straight
from registers, with no trip through shared memory.

How the canonical words map onto the fragment, for one 128-column step of a row: the
row's 16 words are ``kw = 4c + r``, thread lane ``4g + c`` loads words ``4c .. 4c+3``
(one 16-byte load) of rows ``g`` and ``g + 8``. Word ``kw`` holds real columns
``8kw + j`` in nibble ``j = i + 4h`` (``i`` = ``i0 + 2 i1``). The MMA sums over a
*logical* K, and any order of K works if the activation follows the same order, so
real column ``32c + 8r + 4h + 2i1 + i0`` is placed at logical column
``32r + 16i1 + 8i0 + 2c + h``: that is where lane ``c`` holds its A elements
(``2c + {0, 1}`` and ``2c + 8 + {0, 1}`` of each 16-column slice), and the register
pair ``h = 0, 1`` is one LOP3's float pair (nibbles ``i`` and ``i + 4``). The same
thread's B fragment (the activation) is then real columns ``32c .. 32c+31`` of its
tokens: one contiguous 64-byte read per token.

Words come one step ahead in registers (``STAGES`` 1) or through a cp.async ring of
``STAGES`` copy groups, each of ``COPY_STEPS`` steps copied one after the other: each
row's 64-byte pieces of consecutive steps then reach DRAM together, which the H200
served at 3.9-4.1 TB/s against 2.4 for one step's pieces at a time (bench/TUNING.md,
"Copy groups").

With ``X_SHARED`` (``GemmTiles.x_shared``; a ring only) the activation comes through
the ring too, each step's tile copied as ``4 BLOCK_M`` rows of 32 columns, and the
step's MMA runs in four 32-column sub-steps that read their B fragments from shared
memory (``_mma_step_shared``): no activation held in registers a step ahead, which
took the 16-row gated w13 from 227 registers to 172 on sm_90.

The layouts are built at compile time from the integer meta-parameters
(``_words_layout``, ``_input_layout``, ``_acc_layout``): layout objects as kernel
arguments would be hashed and compared on every launch. Needs sm_80+ (``mma.sync``
and PTX ``lop3`` / ``fma.rn.bf16x2``); no interpreter.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,  # emitted only for the warpgroup kernel's ring (X_LOGICAL)
)

from backends.triton._kernels import _activate, _grid_dependency
from backends.triton._kernels_mma_setup import (
    _first_step,
    _load_x,
    _next_step,
    _output_rows,
    _program_ids,
    _token_rows,
    _weight_operands,
)
from backends.triton._kernels_mma_steps import (
    _acc_layout,
    _copy_step,
    _input_copy_layout,
    _input_layout,
    _mma_step,
    _mma_step_shared,
    _to_logical_b,
    _words_layout,
    _x_wgmma_layout,
)

# A CTA-wide barrier: ``thread_barrier`` in triton 3.6, renamed ``barrier`` in 3.7.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
X_LOGICAL: gl.constexpr = gl.constexpr(value=2)
"""``X_SHARED`` of the warpgroup kernel's input ring (``_ring_prologue``)."""


@gluon.jit
def _moe_gemm_mma_kernel(
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
    A_DIV: gl.constexpr,
    GROUP: gl.constexpr,
    HAS_ZP: gl.constexpr,
    GATED: gl.constexpr,
    ACT: gl.constexpr,
    WEIGHT_ROWS: gl.constexpr,
    CT: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    POST_SCALE: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    COPY_STEPS: gl.constexpr,
    K32: gl.constexpr,
    X_SHARED: gl.constexpr,
    PDL: gl.constexpr,
    LOGICAL_OUT: gl.constexpr,
):
    """One (row block, column tile, K split) of the grouped GEMM; see ``_moe_gemm_kernel``.

    Columns tiles in row-block-fastest order (``GemmTiles.group_m`` 0); K steps of 128.
    ``PDL`` (``MoETiles.pdl``): launched with ``launch_pdl``; every program waits for
    the kernel before it (the alignment, w13 or the activation) before its first
    read, and lets the next kernel launch after its K loop: the next kernel's
    programs then wait on multiprocessors this grid's last programs are leaving,
    not beside them for the whole of its last wave (which cost Mixtral M = 16 and 32
    4%; bench/TUNING.md, "Programmatic dependent launch on the gemm path").
    ``LOGICAL_OUT``: the output in logical K order (``_store_tile``).
    """
    if PDL:
        _grid_dependency(WAIT=True, NEXT=False)
    W_LAYOUT: gl.constexpr = _words_layout(BLOCK_N, WARPS)
    X_LAYOUT: gl.constexpr = _input_layout(BLOCK_M, WARPS, 128)
    ACC_LAYOUT: gl.constexpr = _acc_layout(WARPS)
    pid_b, pid_n, pid_s = _program_ids(N, BLOCK_N)
    e = gl.load(block_expert_ptr + pid_b)
    if e < expert_lo or e >= expert_hi:  # unused block (-1), or not in this chunk
        return
    n_rows = gl.load(block_rows_ptr + pid_b)
    w_e, s_e, z_e, stride_wn, rows, row_mask, kw = _weight_operands(
        b_ptr, scale_ptr, zero_ptr, e, expert_lo, pid_n, N, stride_be, stride_bn,
        stride_se, BLOCK_N, W_LAYOUT,
    )  # fmt: skip
    x_rows, x_mask_m, offs_kx = _token_rows(
        sorted_ptr + pid_b * BLOCK_M, n_rows, stride_am, A_DIV, BLOCK_M, X_LAYOUT
    )
    offs_nc, n_mask, rows_c = _output_rows(pid_n, N, BLOCK_N, ACC_LAYOUT)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    acc_up = acc
    k_start = pid_s * k_per_split
    k_end = gl.minimum(k_start + k_per_split, K)
    w_end = k_end // 32 * 4 if K32 else k_end // 8  # K32: 16-byte word loads
    w = (
        w_e, s_e, z_e, rows, row_mask, kw, rows_c, n_mask, k_end, w_end, stride_wn,
    )  # fmt: skip
    copies = (None, None, None)  # X_SHARED: the activation's copies into the ring
    if X_SHARED:
        copies = _input_copies(
            a_ptr, sorted_ptr + pid_b * BLOCK_M, n_rows, stride_am, A_DIV, BLOCK_M,
            WARPS,
        )  # fmt: skip
    rings = (None, None, None)  # without a ring (STAGES 1) nothing is allocated
    if STAGES > 1:  # here: a helper cannot return None (Triton 3.6 and 3.7)
        rings = _ring_prologue(
            w, copies, k_start, N, BLOCK_N, BLOCK_M, GATED, STAGES, COPY_STEPS,
            X_SHARED, a_ptr.dtype.element_ty,
        )  # fmt: skip
    x = _first_x(a_ptr, x_rows, x_mask_m, offs_kx, k_start, k_end, X_SHARED)
    cur = _first_step(
        w, k_start, N, stride_sn, GROUP, HAS_ZP, CT, POST_SCALE, GATED, STAGES > 1
    )
    it = 0
    for k0 in range(k_start, k_end, 128):
        if not X_SHARED:
            x_next = _load_x(a_ptr, x_rows, x_mask_m, offs_kx, k0 + 128, k_end)
        acc, acc_up, cur = _loop_step(
            acc, acc_up, cur, x, rings, w, copies, it, k0 + 128, k_start, N,
            stride_sn, GROUP, HAS_ZP, CT, BLOCK_N, BLOCK_M, WARPS, W_LAYOUT,
            ACC_LAYOUT, POST_SCALE, GATED, STAGES, COPY_STEPS, X_SHARED,
        )  # fmt: skip
        it += 1  # noqa: SIM113 (a Triton range has no enumerate)
        if not X_SHARED:
            x = x_next
    _store_tile(
        acc, acc_up, c_ptr, sorted_ptr + pid_b * BLOCK_M, topk_weights_ptr, bias_ptr,
        e, pid_s, n_rows, offs_nc, n_mask, N, alpha, limit, stride_cs, stride_cm,
        stride_bias, BLOCK_M, gl.SliceLayout(0, ACC_LAYOUT), GATED, ACT, WEIGHT_ROWS,
        HAS_BIAS, PDL, LOGICAL_OUT,
    )  # fmt: skip


@gluon.jit
def _first_x(a_ptr, x_rows, x_mask_m, offs_kx, k0, k_end, X_SHARED: gl.constexpr):
    """The first step's activation in registers (``offs_kx``, unused, with ``X_SHARED``)."""
    x = offs_kx
    if not X_SHARED:
        x = _load_x(a_ptr, x_rows, x_mask_m, offs_kx, k0, k_end)
    return x


@gluon.jit
def _loop_step(
    acc, acc_up, cur, x, rings, w, copies, it, nk, k_start, N, stride_sn,
    GROUP: gl.constexpr, HAS_ZP: gl.constexpr, CT: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, WARPS: gl.constexpr,
    W_LAYOUT: gl.constexpr, ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr,
    GATED: gl.constexpr, STAGES: gl.constexpr, COPY_STEPS: gl.constexpr,
    X_SHARED: gl.constexpr,
):  # fmt: skip
    """Step ``it``: the next step's loads at ``nk``, this step's ring words, its MMAs.

    Returns ``acc``, ``acc_up`` and the next step's ``_first_step``-like tuple.

    Each step loads the next step's scales and input (and, without a ring, its
    words) before its own math; with a ring the words of ``STAGES - 1`` copy groups
    of ``COPY_STEPS`` steps ahead are in flight by cp.async.
    """
    wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up = cur
    nxt = _next_step(
        w, nk, N, stride_sn, sc, sc_up, GROUP, HAS_ZP, CT, POST_SCALE, GATED,
        STAGES > 1,
    )  # fmt: skip
    xs = x
    if STAGES > 1:
        wd, wd_up, xs = _ring_step(
            rings, w, copies, it, x, k_start, N, W_LAYOUT, GATED, STAGES, COPY_STEPS,
            X_SHARED,
        )  # fmt: skip
    acc, acc_up = _mma_pair(
        acc, acc_up, wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up, xs, CT, BLOCK_N,
        BLOCK_M, WARPS, ACC_LAYOUT, POST_SCALE, GATED, X_SHARED,
    )  # fmt: skip
    return acc, acc_up, nxt


@gluon.jit
def _ring_prologue(
    w, copies, k_start, N,
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, GATED: gl.constexpr,
    STAGES: gl.constexpr, COPY_STEPS: gl.constexpr, X_SHARED: gl.constexpr,
    XT: gl.constexpr,
):  # fmt: skip
    """``(ring, ring_up, x_ring)``, the first ``STAGES - 1`` copy groups in flight.

    ``X_SHARED``: 0 words only; 1 (True) the activation too, ``(4 BLOCK_M, 32)`` a
    slot (``_input_copies``); ``X_LOGICAL`` the warpgroup kernel's ``(BLOCK_M, 128)``
    slots of an input already in logical K order.

    Called only with ``STAGES`` > 1; without a ring the caller passes ``None`` thrice.
    """
    w_e, _, _, rows, row_mask, kw, _, _, k_end, w_end, stride_wn = w
    x_base, x_cmask, x_col = copies
    SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    SLOTS: gl.constexpr = STAGES * COPY_STEPS
    ring = gl.allocate_shared_memory(gl.int32, [SLOTS, BLOCK_N, 16], SMEM)
    ring_up = gl.allocate_shared_memory(gl.int32, [SLOTS, BLOCK_N, 16], SMEM)
    x_ring = ring  # unused without X_SHARED
    if X_SHARED == X_LOGICAL:  # the warpgroup kernel's B operand, logical K order
        x_ring = gl.allocate_shared_memory(XT, [SLOTS, BLOCK_M, 128], _x_wgmma_layout())
    elif X_SHARED:
        x_ring = gl.allocate_shared_memory(XT, [SLOTS, 4 * BLOCK_M, 32], SMEM)
    for i in gl.static_range(STAGES - 1):
        _copy_step(
            ring, ring_up, x_ring, i, w_e, rows, row_mask, kw, k_start, w_end,
            stride_wn, N, x_base, x_cmask, x_col, k_end, GATED, STAGES, COPY_STEPS,
            X_SHARED,
        )  # fmt: skip
    return ring, ring_up, x_ring


@gluon.jit
def _ring_step(
    rings, w, copies, it, x, k_start, N,
    W_LAYOUT: gl.constexpr, GATED: gl.constexpr, STAGES: gl.constexpr,
    COPY_STEPS: gl.constexpr, X_SHARED: gl.constexpr,
):  # fmt: skip
    """Step ``it``'s words from the ring (and with ``X_SHARED`` its activation slot).

    At a copy group's first step: copy the next group in, wait for this one. With
    ``X_SHARED`` every thread reads every thread's activation copies: wait for this
    group, then a barrier, and only then overwrite the slots the last group was read
    from (``X_LOGICAL``: a proxy fence before the barrier, as the tensor cores read
    the slots). ``(wd, wd_up, xs)``: ``xs`` the activation's slot, or ``x`` without
    ``X_SHARED``.
    """
    ring, ring_up, x_ring = rings
    w_e, _, _, rows, row_mask, kw, _, _, k_end, w_end, stride_wn = w
    x_base, x_cmask, x_col = copies
    # the condition inline: as a variable it costs an instruction at 1
    if COPY_STEPS == 1 or it % COPY_STEPS == 0:
        if X_SHARED:
            async_copy.wait_group(STAGES - 2)
            if X_SHARED == X_LOGICAL:  # the copies are read by the tensor cores
                fence_async_shared()
            _cta_barrier()
        _copy_step(
            ring, ring_up, x_ring, it // COPY_STEPS + STAGES - 1, w_e, rows, row_mask,
            kw, k_start, w_end, stride_wn, N, x_base, x_cmask, x_col, k_end, GATED,
            STAGES, COPY_STEPS, X_SHARED,
        )  # fmt: skip
        if not X_SHARED:
            async_copy.wait_group(STAGES - 1)
    slot = it // COPY_STEPS % STAGES * COPY_STEPS + it % COPY_STEPS
    wd = ring.index(slot).load(W_LAYOUT)
    wd_up = wd
    if GATED:
        wd_up = ring_up.index(slot).load(W_LAYOUT)
    xs = x
    if X_SHARED:
        xs = x_ring.index(slot)
    return wd, wd_up, xs


@gluon.jit
def _mma_pair(
    acc, acc_up, wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up, xs,
    CT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
    WARPS: gl.constexpr, ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr,
    GATED: gl.constexpr, X_SHARED: gl.constexpr,
):  # fmt: skip
    """One step's MMAs, the gate (or only) rows then the up rows.

    ``xs``: the step's activation slot of the ring with ``X_SHARED``, else the
    activation itself (registers, real K order).
    """
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(0, ACC_LAYOUT, 2)
    B_LAYOUT: gl.constexpr = gl.DotOperandLayout(1, ACC_LAYOUT, 2)
    X_SUB: gl.constexpr = _input_layout(BLOCK_M, WARPS, 32)
    if X_SHARED:
        acc = _mma_step_shared(
            acc, wd, s_b, bias, xs, sc, CT, BLOCK_N, BLOCK_M, A_LAYOUT, B_LAYOUT,
            ACC_LAYOUT, X_SUB, POST_SCALE,
        )  # fmt: skip
        if GATED:
            acc_up = _mma_step_shared(
                acc_up, wd_up, s_up, bias_up, xs, sc_up, CT, BLOCK_N, BLOCK_M,
                A_LAYOUT, B_LAYOUT, ACC_LAYOUT, X_SUB, POST_SCALE,
            )  # fmt: skip
    else:
        b = gl.convert_layout(_to_logical_b(xs.to(CT), BLOCK_M), B_LAYOUT)
        acc = _mma_step(
            acc, wd, s_b, bias, b, sc, CT, BLOCK_N, BLOCK_M, A_LAYOUT, ACC_LAYOUT,
            POST_SCALE,
        )  # fmt: skip
        if GATED:
            acc_up = _mma_step(
                acc_up, wd_up, s_up, bias_up, b, sc_up, CT, BLOCK_N, BLOCK_M,
                A_LAYOUT, ACC_LAYOUT, POST_SCALE,
            )  # fmt: skip
    return acc, acc_up


@gluon.jit
def _input_copies(
    a_ptr,
    block_pairs_ptr,
    n_rows,
    stride_am,
    A_DIV: gl.constexpr,
    BLOCK_M: gl.constexpr,
    WARPS: gl.constexpr,
):
    """``X_SHARED``: the addresses of a row block's activation copies.

    ``(x_base, x_mask, x_col)``: ``[4 BLOCK_M, 32]`` in ``_input_copy_layout`` (sub-step,
    token; position), without the step's column ``k0``, which ``_copy_input`` adds.
    """
    XC: gl.constexpr = _input_copy_layout(WARPS)
    offs_q = gl.arange(0, 4 * BLOCK_M, layout=gl.SliceLayout(1, XC))
    offs_p = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, XC)), 0)
    m_q = offs_q % BLOCK_M
    x_col = 32 * (offs_p // 8) + 8 * gl.expand_dims(offs_q // BLOCK_M, 1) + offs_p % 8
    pairs_c = gl.load(block_pairs_ptr + m_q, mask=m_q < n_rows, other=0)
    rows_q = gl.expand_dims((pairs_c // A_DIV).to(gl.int64) * stride_am, 1)
    return a_ptr + rows_q + x_col, gl.expand_dims(m_q < n_rows, 1), x_col


@gluon.jit
def _store_tile(
    acc, acc_up, c_ptr, block_pairs_ptr, topk_weights_ptr, bias_ptr, e, pid_s, n_rows,
    offs_nc, n_mask, N, alpha, limit, stride_cs, stride_cm, stride_bias,
    BLOCK_M: gl.constexpr, C_COLS: gl.constexpr, GATED: gl.constexpr,
    ACT: gl.constexpr, WEIGHT_ROWS: gl.constexpr, HAS_BIAS: gl.constexpr,
    PDL: gl.constexpr, LOGICAL_OUT: gl.constexpr,
):  # fmt: skip
    """The epilogue of expert ``e``, K split ``pid_s``, in the accumulator's layout.

    With ``PDL`` first lets the next kernel launch. On ``acc[n, m]``: router weights
    of the input rows, the bias (the first K split only), the activation, and the
    store at each pair's row; with ``LOGICAL_OUT`` each 128 columns in logical K
    order (``_logical_columns``), for a warpgroup w2 that copies them as they are.
    """
    if PDL:
        _grid_dependency(WAIT=False, NEXT=True)
    offs_mc = gl.arange(0, BLOCK_M, layout=C_COLS)
    m_mask = offs_mc < n_rows
    pairs = gl.load(block_pairs_ptr + offs_mc, mask=m_mask, other=0)
    if WEIGHT_ROWS:
        rw = gl.load(topk_weights_ptr + pairs, mask=m_mask, other=0.0)
        acc = acc * gl.expand_dims(rw, 0)
        acc_up = acc_up * gl.expand_dims(rw, 0)
    if HAS_BIAS:
        bias_e = bias_ptr + e.to(gl.int64) * stride_bias
        b_mask = n_mask & (pid_s == 0)
        bias = gl.load(bias_e + offs_nc, mask=b_mask, other=0.0).to(gl.float32)
        acc += gl.expand_dims(bias, 1)
        if GATED:
            bias_up = gl.load(bias_e + N + offs_nc, mask=b_mask, other=0.0)
            acc_up += gl.expand_dims(bias_up.to(gl.float32), 1)
    if GATED:
        acc = _activate(acc, acc_up, alpha, limit, ACT)
    cols = offs_nc
    if LOGICAL_OUT:
        cols = _logical_columns(offs_nc)
    c_ptrs = (
        c_ptr
        + pid_s * stride_cs
        + gl.expand_dims(pairs.to(gl.int64) * stride_cm, 0)
        + gl.expand_dims(cols, 1)
    )
    mask = gl.expand_dims(n_mask, 1) & gl.expand_dims(m_mask, 0)
    gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _logical_columns(cols):
    """Where real column ``cols`` goes in logical K order, within its 128 columns.

    Real ``32c + 8r + 4h + 2i1 + i0`` to logical ``32r + 16i1 + 8i0 + 2c + h``
    (``permute_logical`` on the host).
    """
    j = cols % 128
    c, r, h, i1, i0 = j // 32, j // 8 % 4, j // 4 % 2, j // 2 % 2, j % 2
    return cols - j + 32 * r + 16 * i1 + 8 * i0 + 2 * c + h
