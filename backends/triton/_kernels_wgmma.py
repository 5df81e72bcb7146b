# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Gluon kernel of the decode GEMM on Hopper: int4 words into ``wgmma``'s register A.

``_moe_gemm_wgmma_kernel`` computes what ``_moe_gemm_mma_kernel`` computes (same
arguments, same outputs) with the warpgroup MMA of sm_90 (``wgmma.mma_async``
m64nNk16) instead of ``mma.sync`` m16n8k16. Within each warp the A fragment of the
warpgroup instruction is that of ``mma.sync`` (rows ``g`` and ``g + 8`` of the warp's
16, columns ``2c + {0, 1, 8, 9}`` of each 16-column slice), so the words reach the
tensor cores in the same logical K order from the same loads (``_kernels_mma.py`` has
the map). What changes is the other operand: the tokens (the instruction's N, 8 to
256) are read by the tensor cores from shared memory, not held in every thread's
registers. The ``mma.sync`` form holds a row block's activation fragments in each
thread (64 registers a step at 32 rows), which spills past 16-row blocks; here a
step's activation is written once into one of two shared-memory slots, in logical K
order, and 32-row blocks (or more) cost the accumulator's ``BLOCK_M / 2`` registers
a thread and tile, so an expert with 17-32 pairs is read once instead of twice.

Words come one step ahead in registers (``STAGES`` 1, ``_load_words``) or through the
``mma.sync`` kernel's cp.async ring (``STAGES`` > 1: ``_ring_prologue``,
``_ring_step``; each thread copies and reads back its own words, so the ring needs no
barrier of its own); scales one step ahead in registers. The activation of the next
step is loaded into registers during the step and stored into the other slot while
the step's MMAs run (``ASYNC``; else after them), a CTA barrier ending each step.

With ``X_RING`` (``GemmTiles.x_shared``, a ring only) the input is already in logical
K order in memory (w2's: w13's output written so, ``LOGICAL_OUT``; w13's:
``permute_logical``), so each step's tile is copied by cp.async, as it is, with the
step's words into a ring slot of its own that the MMAs read (``_wgmma_ring_loop``):
no activation in registers, no shared stores, one barrier (with a proxy fence) a copy
group. Offline (sm_90, Triton 3.6, ``compile_sm90.py wgmma x``) that takes the 32-row
ring of one-step groups from 387 to 339 SASS a step for the gated w13 and from 255 to
209 for w2, and from 168 / 125 registers to 150 / 108.
sm_90 only (``wgmma``); no interpreter.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from backends.triton._kernels import _grid_dependency
from backends.triton._kernels_mma import (
    X_LOGICAL,
    _ring_prologue,
    _ring_step,
    _store_tile,
)
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
    _dequant,
    _words_layout,
    _x_wgmma_layout,
)

# A CTA-wide barrier: ``thread_barrier`` in triton 3.6, renamed ``barrier`` in 3.7.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
NO_X_RING: gl.constexpr = gl.constexpr(value=False)
"""``X_SHARED`` of the ring's helpers: the activation has its own slots here."""
WORD_RING: gl.constexpr = gl.constexpr(value=True)
"""``RING`` of ``_first_step`` / ``_next_step``: the words come through the ring."""
STAGE_X: gl.constexpr = gl.constexpr(value=True)
"""``STAGE`` of ``_wgmma_pair``: the next activation is stored during the step."""
NO_STAGE: gl.constexpr = gl.constexpr(value=False)
"""``STAGE`` of ``_wgmma_pair`` with ``X_RING``: the copies bring it."""


@gluon.constexpr_function
def _wgmma_layout(block_m, warps):
    """The accumulator: ``wgmma`` m64 tiles of ``block_m`` columns, warps along the rows."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, block_m, 16]
    )


@gluon.constexpr_function
def _x_load_layout(warps):
    """A step's activation ``(block_m, 128)`` as loaded: 16 bytes a thread, K fastest."""
    return gl.BlockedLayout([1, 8], [2, 16], [warps, 1], [1, 0])


@gluon.jit
def _to_logical_rows(x, BLOCK_M: gl.constexpr):
    """Activation ``x[m, k]`` (real K order) to ``(BLOCK_M, 128)`` in logical K order.

    Real column ``32c + 8r + 4h + 2i1 + i0`` to logical ``32r + 16i1 + 8i0 + 2c + h``
    (``_kernels_mma.py``), each token's row kept.
    """
    v = gl.reshape(x, [BLOCK_M, 4, 4, 2, 2, 2])  # [m, c, r, h, i1, i0]
    v = gl.permute(v, [0, 2, 4, 5, 1, 3])  # [m, r, i1, i0, c, h]
    return gl.reshape(v, [BLOCK_M, 128])


@gluon.jit
def _wgmma_step(
    acc, words, s_b, bias, xs, sc,
    CT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
    A_LAYOUT: gl.constexpr, ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr,
):  # fmt: skip
    """``acc`` plus one 128-column step: the dequantized words times slot ``xs``."""
    tok, a = _wgmma_issue(
        acc, words, s_b, bias, xs, CT, BLOCK_N, BLOCK_M, A_LAYOUT, ACC_LAYOUT,
        POST_SCALE,
    )  # fmt: skip
    return _wgmma_retire(acc, tok, a, sc, 0, POST_SCALE)


@gluon.jit
def _wgmma_issue(
    acc, words, s_b, bias, xs,
    CT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
    A_LAYOUT: gl.constexpr, ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr,
):  # fmt: skip
    """Dequantize a step's words and start its MMA against slot ``xs``, asynchronously.

    ``(token, a)``: the MMA's pending result and its A operand, which must stay in
    registers until ``_wgmma_retire`` waits for it. With ``POST_SCALE`` the MMA starts
    from zero (the step's product, scaled when retired), else from ``acc``.
    """
    a = _dequant(words, s_b, bias, CT, BLOCK_N, A_LAYOUT, POST_SCALE)
    b = xs.permute((1, 0))  # (128, BLOCK_M)
    if POST_SCALE:
        zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
        tok = warpgroup_mma(a, b, zero, use_acc=False, is_async=True)
    else:
        tok = warpgroup_mma(a, b, acc, is_async=True)
    return tok, a


@gluon.jit
def _wgmma_retire(acc, tok, a, sc, PENDING: gl.constexpr, POST_SCALE: gl.constexpr):
    """Wait until at most ``PENDING`` MMAs are in flight, ``tok``'s done; add it to ``acc``."""
    p, a = warpgroup_mma_wait(PENDING, deps=[tok, a])
    if POST_SCALE:
        acc += p * sc
    else:
        acc = p
    return acc


@gluon.jit
def _moe_gemm_wgmma_kernel(
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
    PDL: gl.constexpr,
    ASYNC: gl.constexpr,
    STAGES: gl.constexpr,
    COPY_STEPS: gl.constexpr,
    K32: gl.constexpr,
    X_RING: gl.constexpr,
    LOGICAL_OUT: gl.constexpr,
):
    """One (row block, column tile, K split) of the grouped GEMM; see ``_moe_gemm_kernel``.

    Column tiles in row-block-fastest order; K steps of 128. ``PDL``, ``STAGES``,
    ``COPY_STEPS``, ``K32`` and ``LOGICAL_OUT`` as in ``_moe_gemm_mma_kernel`` (no
    ``X_SHARED``: without ``X_RING`` the activation has its own two slots here).
    ``X_RING`` (a ring only; ``GemmTiles.x_shared``): the input is in logical K order
    and comes through the ring with the words (``_wgmma_ring_loop``).
    """
    if PDL:
        _grid_dependency(WAIT=True, NEXT=False)
    W_LAYOUT: gl.constexpr = _words_layout(BLOCK_N, WARPS)
    ACC_LAYOUT: gl.constexpr = _wgmma_layout(BLOCK_M, WARPS)
    X_LAYOUT: gl.constexpr = _x_load_layout(WARPS)
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
    k_start = pid_s * k_per_split
    k_end = gl.minimum(k_start + k_per_split, K)
    w_end = k_end // 32 * 4 if K32 else k_end // 8  # K32: 16-byte word copies
    w = (
        w_e, s_e, z_e, rows, row_mask, kw, rows_c, n_mask, k_end, w_end, stride_wn,
    )  # fmt: skip
    x = (a_ptr, x_rows, x_mask_m, offs_kx)
    if X_RING:
        acc, acc_up = _wgmma_ring_loop(
            x, w, k_start, k_end, N, stride_sn, GROUP, HAS_ZP, CT, BLOCK_N, BLOCK_M,
            W_LAYOUT, ACC_LAYOUT, POST_SCALE, GATED, ASYNC, STAGES, COPY_STEPS,
        )  # fmt: skip
    else:
        acc, acc_up = _wgmma_slot_loop(
            x, w, k_start, k_end, N, stride_sn, GROUP, HAS_ZP, CT, BLOCK_N, BLOCK_M,
            W_LAYOUT, ACC_LAYOUT, POST_SCALE, GATED, ASYNC, STAGES, COPY_STEPS,
        )  # fmt: skip
    _store_tile(
        acc, acc_up, c_ptr, sorted_ptr + pid_b * BLOCK_M, topk_weights_ptr, bias_ptr,
        e, pid_s, n_rows, offs_nc, n_mask, N, alpha, limit, stride_cs,
        stride_cm, stride_bias, BLOCK_M, gl.SliceLayout(0, ACC_LAYOUT), GATED, ACT,
        WEIGHT_ROWS, HAS_BIAS, PDL, LOGICAL_OUT,
    )  # fmt: skip


@gluon.jit
def _wgmma_slot_loop(
    x, w, k_start, k_end, N, stride_sn,
    GROUP: gl.constexpr, HAS_ZP: gl.constexpr, CT: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, W_LAYOUT: gl.constexpr,
    ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr, GATED: gl.constexpr,
    ASYNC: gl.constexpr, STAGES: gl.constexpr, COPY_STEPS: gl.constexpr,
):  # fmt: skip
    """The K loop with the activation through registers into two shared slots.

    ``x``: ``(a_ptr, x_rows, x_mask_m, offs_kx)`` (``_token_rows``), real K order.
    Returns ``(acc, acc_up)``.
    """
    a_ptr, x_rows, x_mask_m, offs_kx = x
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(0, ACC_LAYOUT, 2)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    acc_up = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    slots = gl.allocate_shared_memory(CT, [2, BLOCK_M, 128], _x_wgmma_layout())
    no_copies = (None, None, None)  # the ring carries words only (NO_X_RING)
    rings = (None, None, None)  # without a ring (STAGES 1) nothing is allocated
    if STAGES > 1:  # here: a helper cannot return None (Triton 3.6 and 3.7)
        rings = _ring_prologue(
            w, no_copies, k_start, N, BLOCK_N, BLOCK_M, GATED, STAGES, COPY_STEPS,
            NO_X_RING, a_ptr.dtype.element_ty,
        )  # fmt: skip
    xv = _load_x(a_ptr, x_rows, x_mask_m, offs_kx, k_start, k_end)
    _stage(slots.index(0), xv, CT, BLOCK_M)
    _cta_barrier()
    cur = _first_step(
        w, k_start, N, stride_sn, GROUP, HAS_ZP, CT, POST_SCALE, GATED, STAGES > 1
    )
    it = 0
    for k0 in range(k_start, k_end, 128):
        x_next = _load_x(a_ptr, x_rows, x_mask_m, offs_kx, k0 + 128, k_end)
        acc, acc_up, cur = _wgmma_loop_step(
            acc, acc_up, cur, rings, w, slots, x_next, it, k0 + 128, k_start, N,
            stride_sn, GROUP, HAS_ZP, CT, BLOCK_N, BLOCK_M, W_LAYOUT, A_LAYOUT,
            ACC_LAYOUT, POST_SCALE, GATED, ASYNC, STAGES, COPY_STEPS,
        )  # fmt: skip
        _cta_barrier()  # the next slot's stores visible to the next step's MMAs
        it += 1  # noqa: SIM113 (a Triton range has no enumerate)
    return acc, acc_up


@gluon.jit
def _wgmma_ring_loop(
    x, w, k_start, k_end, N, stride_sn,
    GROUP: gl.constexpr, HAS_ZP: gl.constexpr, CT: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, W_LAYOUT: gl.constexpr,
    ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr, GATED: gl.constexpr,
    ASYNC: gl.constexpr, STAGES: gl.constexpr, COPY_STEPS: gl.constexpr,
):  # fmt: skip
    """The K loop with the activation copied with the words (``X_RING``).

    The input is in logical K order already (a w13 with ``LOGICAL_OUT``, or
    ``permute_logical``), so each step's ``(BLOCK_M, 128)`` tile is copied by cp.async
    as it is into its ring slot, which the MMAs read: no activation in registers, no
    stores, one barrier a copy group (``_ring_step``). Returns ``(acc, acc_up)``.
    """
    a_ptr, x_rows, x_mask_m, offs_kx = x
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(0, ACC_LAYOUT, 2)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    acc_up = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    copies = (a_ptr + x_rows + offs_kx, x_mask_m, offs_kx)
    rings = _ring_prologue(
        w, copies, k_start, N, BLOCK_N, BLOCK_M, GATED, STAGES, COPY_STEPS, X_LOGICAL,
        a_ptr.dtype.element_ty,
    )  # fmt: skip
    cur = _first_step(
        w, k_start, N, stride_sn, GROUP, HAS_ZP, CT, POST_SCALE, GATED, WORD_RING
    )
    it = 0
    for k0 in range(k_start, k_end, 128):
        wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up = cur
        cur = _next_step(
            w, k0 + 128, N, stride_sn, sc, sc_up, GROUP, HAS_ZP, CT, POST_SCALE,
            GATED, WORD_RING,
        )  # fmt: skip
        wd, wd_up, xs = _ring_step(
            rings, w, copies, it, None, k_start, N, W_LAYOUT, GATED, STAGES,
            COPY_STEPS, X_LOGICAL,
        )  # fmt: skip
        acc, acc_up = _wgmma_pair(
            acc, acc_up, wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up, xs, None,
            None, CT, BLOCK_N, BLOCK_M, A_LAYOUT, ACC_LAYOUT, POST_SCALE, GATED,
            ASYNC, NO_STAGE,
        )  # fmt: skip
        it += 1  # noqa: SIM113 (a Triton range has no enumerate)
    return acc, acc_up


@gluon.jit
def _wgmma_loop_step(
    acc, acc_up, cur, rings, w, slots, x_next, it, nk, k_start, N, stride_sn,
    GROUP: gl.constexpr, HAS_ZP: gl.constexpr, CT: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, W_LAYOUT: gl.constexpr,
    A_LAYOUT: gl.constexpr, ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr,
    GATED: gl.constexpr, ASYNC: gl.constexpr, STAGES: gl.constexpr,
    COPY_STEPS: gl.constexpr,
):  # fmt: skip
    """Step ``it``: the next step's scales (and words) at ``nk``, this step's MMAs.

    Returns ``acc``, ``acc_up`` and the next step's ``_first_step``-like tuple. The
    step's activation is in slot ``it % 2``; ``x_next`` goes into the other one, which
    the step before read, its MMAs waited for by every warp before the barrier that
    ended it. With a ring (``STAGES`` > 1) the words come from ``_ring_step``.
    """
    wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up = cur
    nxt = _next_step(
        w, nk, N, stride_sn, sc, sc_up, GROUP, HAS_ZP, CT, POST_SCALE, GATED,
        STAGES > 1,
    )  # fmt: skip
    if STAGES > 1:
        wd, wd_up, _ = _ring_step(
            rings, w, (None, None, None), it, x_next, k_start, N, W_LAYOUT, GATED,
            STAGES, COPY_STEPS, NO_X_RING,
        )  # fmt: skip
    acc, acc_up = _wgmma_pair(
        acc, acc_up, wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up,
        slots.index(it % 2), x_next, slots.index((it + 1) % 2), CT, BLOCK_N, BLOCK_M,
        A_LAYOUT, ACC_LAYOUT, POST_SCALE, GATED, ASYNC, STAGE_X,
    )  # fmt: skip
    return acc, acc_up, nxt


@gluon.jit
def _stage(slot, x, CT: gl.constexpr, BLOCK_M: gl.constexpr):
    """A step's activation into ``slot`` in logical K order.

    The fence orders these generic-proxy stores before the tensor cores' reads; a CTA
    barrier must follow before any warpgroup's MMA reads the slot.
    """
    slot.store(_to_logical_rows(x.to(CT), BLOCK_M))
    fence_async_shared()


@gluon.jit
def _wgmma_pair(
    acc, acc_up, wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up, xs, x_next, x_slot,
    CT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
    A_LAYOUT: gl.constexpr, ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr,
    GATED: gl.constexpr, ASYNC: gl.constexpr, STAGE: gl.constexpr,
):  # fmt: skip
    """One step's MMAs against slot ``xs``, and with ``STAGE`` the next activation staged.

    Gate (or only) rows, then up rows; ``x_next`` goes into ``x_slot``. With
    ``ASYNC`` the MMAs run while the up rows dequantize and the next activation is
    stored; else each MMA is waited for before the next dequantization.
    """
    if ASYNC:
        tok, a = _wgmma_issue(
            acc, wd, s_b, bias, xs, CT, BLOCK_N, BLOCK_M, A_LAYOUT, ACC_LAYOUT,
            POST_SCALE,
        )  # fmt: skip
        if GATED:
            tok_up, a_up = _wgmma_issue(
                acc_up, wd_up, s_up, bias_up, xs, CT, BLOCK_N, BLOCK_M, A_LAYOUT,
                ACC_LAYOUT, POST_SCALE,
            )  # fmt: skip
        if STAGE:
            _stage(x_slot, x_next, CT, BLOCK_M)
        if GATED:
            acc = _wgmma_retire(acc, tok, a, sc, 1, POST_SCALE)
            acc_up = _wgmma_retire(acc_up, tok_up, a_up, sc_up, 0, POST_SCALE)
        else:
            acc = _wgmma_retire(acc, tok, a, sc, 0, POST_SCALE)
    else:
        acc = _wgmma_step(
            acc, wd, s_b, bias, xs, sc, CT, BLOCK_N, BLOCK_M, A_LAYOUT, ACC_LAYOUT,
            POST_SCALE,
        )  # fmt: skip
        if GATED:
            acc_up = _wgmma_step(
                acc_up, wd_up, s_up, bias_up, xs, sc_up, CT, BLOCK_N, BLOCK_M,
                A_LAYOUT, ACC_LAYOUT, POST_SCALE,
            )  # fmt: skip
        if STAGE:
            _stage(x_slot, x_next, CT, BLOCK_M)
    return acc, acc_up
