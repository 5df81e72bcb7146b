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
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from backends.triton._kernels import _activate
from backends.triton._kernels_tiles import (
    _BF16_WORD_ASM,
    _FP16_WORD_ASM,
    _WORD_ASM,
    word_asm_for,
)

_CODES_ASM = "\n".join(
    line
    for line in _WORD_ASM.splitlines()
    if not line.startswith(("mov.b32 s2", "mov.b32 nz")) and ", s2, nz;" not in line
)
"""Eight codes of a word to ``q - z`` (exact small integers): ``_kernels_tiles``'s
``_WORD_ASM`` without its scaling FMAs (its scale operand ``$9`` unused), the scale
being applied to the float32 product instead (``POST_SCALE``)."""
_BF16_CODES_ASM = gl.constexpr(word_asm_for(_CODES_ASM, bf16=True))
_FP16_CODES_ASM = gl.constexpr(word_asm_for(_CODES_ASM, bf16=False))


@gluon.constexpr_function
def _powers(first, count, dim):
    """Bases ``first * 2**j`` (``j < count``) along dimension ``dim`` of a 2-D tensor."""
    return [[first << j, 0] if dim == 0 else [0, first << j] for j in range(count)]


@gluon.constexpr_function
def _words_layout(block_n, warps):
    """The words' layout, ``(block_n, 16)`` int32 of a 128-column step.

    Lane ``4g + c`` holds words ``4c .. 4c+3`` (registers) of rows ``g`` and ``g + 8``
    (a register); the warps and further repeats stack along the rows.
    """
    warp_bits = warps.bit_length() - 1
    row_reps = (block_n // (16 * warps)).bit_length() - 1
    return gl.DistributedLinearLayout(
        reg_bases=[*_powers(1, 2, 1), [8, 0], *_powers(16 * warps, row_reps, 0)],
        lane_bases=_powers(4, 2, 1) + _powers(1, 3, 0),
        warp_bases=_powers(16, warp_bits, 0),
        block_bases=[],
        shape=[block_n, 16],
    )


@gluon.constexpr_function
def _input_layout(block_m, warps, width):
    """The activation's layout, ``(block_m, width)``.

    ``width`` 128: a step's columns; 32: a sub-step's slice read from the shared ring,
    where position ``8c + e`` holds real column ``32c + 8r + e`` of sub-step ``r``.
    Lane ``4g + c`` holds positions ``c w .. c w + w - 1`` (``w = width / 4``) of
    tokens ``g`` (and ``g + 8``, ... in registers), the same in every warp.
    """
    per_lane = width // 4
    token_reps = (block_m // 8).bit_length() - 1
    return gl.DistributedLinearLayout(
        reg_bases=_powers(1, per_lane.bit_length() - 1, 1) + _powers(8, token_reps, 0),
        lane_bases=_powers(per_lane, 2, 1) + _powers(1, 3, 0),
        warp_bases=[[0, 0]] * (warps.bit_length() - 1),
        block_bases=[],
        shape=[block_m, width],
    )


@gluon.constexpr_function
def _input_copy_layout(warps):
    """Copies of one step's activation into the ring, ``(4 * block_m, 32)``.

    Row ``r * block_m + m``: sub-step ``r``, token ``m``; 16 bytes a thread and copy.
    """
    return gl.BlockedLayout([1, 8], [8, 4], [warps, 1], [1, 0])


@gluon.constexpr_function
def _acc_layout(warps):
    """The accumulator: ``mma.sync`` m16n8 tiles, warps along the rows."""
    return gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[warps, 1], instr_shape=[16, 8]
    )


@gluon.jit
def _join_planes(p0, p1, p2, p3, p4, p5, p6, p7):
    """Nibble planes ``p_j[n, w]`` (``j = i + 4h``, ``i = i0 + 2 i1``) as ``[n, w, h, i0, i1]``."""
    q0 = gl.join(p0, p4)  # [n, w, h]
    q1 = gl.join(p1, p5)
    q2 = gl.join(p2, p6)
    q3 = gl.join(p3, p7)
    return gl.join(gl.join(q0, q1), gl.join(q2, q3))


@gluon.jit
def _to_logical_a(p0, p1, p2, p3, p4, p5, p6, p7, BLOCK_N: gl.constexpr):
    """Nibble planes ``p_j[n, kw]`` to the ``(BLOCK_N, 128)`` tile in logical K order."""
    v = _join_planes(p0, p1, p2, p3, p4, p5, p6, p7)  # [n, kw, h, i0, i1]
    v = gl.reshape(v, [BLOCK_N, 4, 4, 2, 2, 2])  # [n, c, r, h, i0, i1]
    v = gl.permute(v, [0, 2, 5, 4, 1, 3])  # [n, r, i1, i0, c, h]
    return gl.reshape(v, [BLOCK_N, 128])


@gluon.jit
def _to_logical_b(x, BLOCK_M: gl.constexpr):
    """Activation ``x[m, k]`` (real K order) to the ``(128, BLOCK_M)`` B tile, logical K."""
    v = gl.reshape(x, [BLOCK_M, 4, 4, 2, 2, 2])  # [m, c, r, h, i1, i0]
    v = gl.permute(v, [2, 4, 5, 1, 3, 0])  # [r, i1, i0, c, h, m]
    return gl.reshape(v, [128, BLOCK_M])


@gluon.jit
def _to_logical_a32(p0, p1, p2, p3, p4, p5, p6, p7, BLOCK_N: gl.constexpr):
    """Nibble planes ``p_j[n, c]`` of sub-step ``r``'s words to ``(BLOCK_N, 32)``, logical K."""
    v = _join_planes(p0, p1, p2, p3, p4, p5, p6, p7)  # [n, c, h, i0, i1]
    v = gl.permute(v, [0, 4, 3, 1, 2])  # [n, i1, i0, c, h]
    return gl.reshape(v, [BLOCK_N, 32])


@gluon.jit
def _to_logical_b32(x, BLOCK_M: gl.constexpr):
    """A sub-step's activation slice ``x[m, 8c + e]`` to the ``(32, BLOCK_M)`` B tile."""
    v = gl.reshape(x, [BLOCK_M, 4, 2, 2, 2])  # [m, c, h, i1, i0]
    v = gl.permute(v, [3, 4, 1, 2, 0])  # [i1, i0, c, h, m]
    return gl.reshape(v, [32, BLOCK_M])


@gluon.jit
def _split4(t, BLOCK_N: gl.constexpr):
    """A ``(BLOCK_N, 16)`` words-layout tensor into its four ``(BLOCK_N, 4)`` sub-steps.

    Word ``kw = 4c + r`` goes to sub-step ``r``, at column ``c``.
    """
    v = gl.reshape(t, [BLOCK_N, 4, 2, 2])  # [n, c, r1, r0]
    e, o = gl.split(v)  # r0 = 0, 1
    t0, t2 = gl.split(e)
    t1, t3 = gl.split(o)
    return t0, t1, t2, t3


@gluon.jit
def _copy_input(slots, x_base, x_mask, x_col, k0, k_end):
    """Start the copy of the activation's step at ``k0`` into ``slots`` ``(4 BLOCK_M, 32)``.

    ``x_base``, ``x_mask`` and ``x_col`` (``_input_copy_layout``) address row
    ``r * BLOCK_M + m`` (sub-step ``r``, token ``m``), position ``8c + e`` at real
    column ``32c + 8r + e``. Needs ``k_end % 32 == 0`` and rows of whole 16-byte
    chunks (``launch_gemm`` runs ``X_SHARED`` only then), written so that Triton sees
    it: 16-byte copies.
    """
    async_copy.async_copy_global_to_shared(
        slots, x_base + k0, mask=x_mask & (x_col + k0 < k_end // 32 * 32)
    )


@gluon.jit
def _load_words(
    w_e,
    s_e,
    z_e,
    rows,
    row_mask,
    kw,
    k0,
    k_end,
    w_end,
    stride_wn,
    stride_sn,
    GROUP: gl.constexpr,
    HAS_ZP: gl.constexpr,
    CT: gl.constexpr,
    POST_SCALE: gl.constexpr,
    RING: gl.constexpr,
):
    """Words, scales and bias ``-(MAGIC + z)`` of rows ``rows`` (``[BLOCK_N, 1]``) at ``k0``.

    Nothing is read at or past ``k_end`` (the last step's loads of the next step are
    masked off entirely). Scales and biases come in ``CT``, broadcast to the words;
    with ``POST_SCALE`` no scales are read (``_row_scales`` reads them) and the
    bias stands in for them. With ``RING`` the words come through shared memory
    (``_copy_words``) and zeros stand in for them here. ``w_end``: ``k_end // 8``,
    written so that Triton sees its divisibility (``_copy_words``).
    """
    if RING:
        offs_w = k0 // 128 * 16 + kw  # [1, 16]
        mask = row_mask & (offs_w < w_end)
        words = mask.to(gl.int32) * 0
    else:
        # Written so that Triton sees 8-byte alignment only: with the 16-byte loads
        # of the ring's form this path ran 3-10% slower on the H200
        # (bench/sweeps/probe_mma4_h200.log against probe_mma3_h200.log).
        offs_w = k0 // 8 + kw  # [1, 16]
        mask = row_mask & (offs_w < k_end // 8)
        words = gl.load(w_e + rows * stride_wn + offs_w, mask=mask, other=0)
    if GROUP >= 128:  # one group per row and step
        g_ptr = rows * stride_sn + k0 // GROUP
        g_mask = row_mask & (k0 < k_end)
    else:
        g_ptr = rows * stride_sn + (k0 + 8 * kw) // GROUP
        g_mask = mask
    if HAS_ZP:
        z = gl.load(z_e + g_ptr, mask=g_mask, other=0.0).to(gl.float32)
    else:
        z = gl.full(g_ptr.shape, 8.0, gl.float32, g_ptr.type.layout)
    magic = 128.0 if CT == gl.bfloat16 else 1024.0  # noqa: SIM300 (CT is a constexpr)
    bias = gl.broadcast((-(z + magic)).to(CT), words)[0]
    if POST_SCALE:
        s_b = bias
    else:
        s = gl.load(s_e + g_ptr, mask=g_mask, other=0.0)
        s_b = gl.broadcast(s.to(CT), words)[0]
    return words, s_b, bias


@gluon.jit
def _copy_words(slot, w_e, rows, row_mask, kw, k0, w_end, stride_wn):
    """Start an asynchronous copy (``cp.async``) of the words at ``k0`` into ``slot``.

    Each thread copies the 16 bytes it later reads back in the words' layout, so no
    thread reads another's copy. ``k0 // 8`` and ``w_end`` are written so that
    Triton sees their divisibility by 4 words (``k0`` is a multiple of 128; ``w_end``
    with ``K32``): 16-byte copies, else 8-byte ones.
    """
    offs_w = k0 // 128 * 16 + kw  # k0 // 8
    mask = row_mask & (offs_w < w_end)
    async_copy.async_copy_global_to_shared(
        slot, w_e + rows * stride_wn + offs_w, mask=mask
    )


@gluon.jit
def _copy_step(
    ring, ring_up, x_ring, group, w_e, rows, row_mask, kw, k_start, w_end, stride_wn,
    N, x_base, x_mask, x_col, k_end,
    GATED: gl.constexpr, STAGES: gl.constexpr, COPY_STEPS: gl.constexpr,
    X_SHARED: gl.constexpr,
):  # fmt: skip
    """Copy group ``group`` of the ring: ``COPY_STEPS`` steps' words, one commit group.

    The steps from ``k_start + 128 * COPY_STEPS * group`` on (w13: gate and up
    rows) go to the group's ``COPY_STEPS`` ring slots. Each row's steps are copied one
    right after the other: their 64-byte pieces of the row reach DRAM together. With
    ``X_SHARED`` the steps' activation goes to ``x_ring`` too (``_copy_input``).
    """
    first = group % STAGES * COPY_STEPS
    k0 = k_start + 128 * COPY_STEPS * group
    if X_SHARED:
        for i in gl.static_range(COPY_STEPS):
            _copy_input(
                x_ring.index(first + i), x_base, x_mask, x_col, k0 + 128 * i,
                k_end,
            )  # fmt: skip
    for i in gl.static_range(COPY_STEPS):
        _copy_words(
            ring.index(first + i), w_e, rows, row_mask, kw, k0 + 128 * i, w_end,
            stride_wn,
        )  # fmt: skip
    if GATED:
        for i in gl.static_range(COPY_STEPS):
            _copy_words(
                ring_up.index(first + i), w_e, rows + N, row_mask, kw, k0 + 128 * i,
                w_end, stride_wn,
            )  # fmt: skip
    async_copy.commit_group()


@gluon.jit
def _row_scales(s_e, rows, n_mask, k0, k_end, stride_sn, GROUP: gl.constexpr):
    """Float32 scales ``[BLOCK_N, 1]`` of rows ``rows`` at step ``k0`` (one group a step)."""
    g_ptr = rows * stride_sn + k0 // GROUP
    s = gl.load(s_e + g_ptr, mask=n_mask & (k0 < k_end), other=0.0)
    return gl.expand_dims(s.to(gl.float32), 1)


@gluon.jit
def _word_planes(words, s_b, bias, CT: gl.constexpr, POST_SCALE: gl.constexpr):
    """Each word's eight codes in ``CT``, as eight planes of ``words``' shape.

    Plane ``i + 4h`` holds nibble ``i + 4h``: ``(q - z) * s``, or with ``POST_SCALE``
    only ``q - z`` (exact). One inline-PTX block a word.
    """
    BF16: gl.constexpr = CT == gl.bfloat16  # noqa: SIM300 (CT is a constexpr)
    CODES: gl.constexpr = _BF16_CODES_ASM if BF16 else _FP16_CODES_ASM
    WORD: gl.constexpr = _BF16_WORD_ASM if BF16 else _FP16_WORD_ASM
    ASM: gl.constexpr = CODES if POST_SCALE else WORD
    return gl.inline_asm_elementwise(
        ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, s_b, bias],
        dtype=(CT.value,) * 8, is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def _dequant(
    words,
    s_b,
    bias,
    CT: gl.constexpr,
    BLOCK_N: gl.constexpr,
    A_LAYOUT: gl.constexpr,
    POST_SCALE: gl.constexpr,
):
    """The ``(BLOCK_N, 128)`` A operand: codes as ``(q - z) * s`` in ``CT``.

    With ``POST_SCALE`` only ``q - z`` (exact); the kernel scales the product.
    """
    p0, p1, p2, p3, p4, p5, p6, p7 = _word_planes(words, s_b, bias, CT, POST_SCALE)
    a = _to_logical_a(p0, p1, p2, p3, p4, p5, p6, p7, BLOCK_N)
    return gl.convert_layout(a, A_LAYOUT)


@gluon.jit
def _mma_step(
    acc, words, s_b, bias, b, sc,
    CT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
    A_LAYOUT: gl.constexpr, ACC_LAYOUT: gl.constexpr, POST_SCALE: gl.constexpr,
):  # fmt: skip
    """``acc`` plus one 128-column step: the dequantized words times the input ``b``.

    With ``POST_SCALE`` the step's product is scaled by the row scales ``sc``.
    """
    a = _dequant(words, s_b, bias, CT, BLOCK_N, A_LAYOUT, POST_SCALE)
    if POST_SCALE:
        zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
        acc += mma_v2(a, b, zero) * sc
    else:
        acc = mma_v2(a, b, acc)
    return acc


@gluon.jit
def _mma_sub(
    p, w, s_b, bias, xs,
    CT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
    A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr, X_SUB: gl.constexpr,
    POST_SCALE: gl.constexpr,
):  # fmt: skip
    """``p`` plus one 32-column sub-step: words ``w`` ``(BLOCK_N, 4)`` times ``xs``'s slice."""
    p0, p1, p2, p3, p4, p5, p6, p7 = _word_planes(w, s_b, bias, CT, POST_SCALE)
    a = gl.convert_layout(
        _to_logical_a32(p0, p1, p2, p3, p4, p5, p6, p7, BLOCK_N), A_LAYOUT
    )
    x = xs.load(X_SUB)
    b = gl.convert_layout(_to_logical_b32(x.to(CT), BLOCK_M), B_LAYOUT)
    return mma_v2(a, b, p)


@gluon.jit
def _mma_step_shared(
    acc, words, s_b, bias, xs, sc,
    CT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
    A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr, ACC_LAYOUT: gl.constexpr,
    X_SUB: gl.constexpr, POST_SCALE: gl.constexpr,
):  # fmt: skip
    """``_mma_step`` with the activation from the shared ring ``xs`` ``(4 BLOCK_M, 32)``.

    Four sub-steps of 32 columns: word ``4c + r`` of each lane in sub-step ``r``.
    """
    w0, w1, w2, w3 = _split4(words, BLOCK_N)
    s0, s1, s2, s3 = _split4(s_b, BLOCK_N)
    b0, b1, b2, b3 = _split4(bias, BLOCK_N)
    if POST_SCALE:  # noqa: SIM108 (a constexpr branch, resolved at compile time)
        p = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    else:
        p = acc
    p = _mma_sub(
        p, w0, s0, b0, xs.slice(0, BLOCK_M), CT, BLOCK_N, BLOCK_M, A_LAYOUT, B_LAYOUT,
        X_SUB, POST_SCALE,
    )  # fmt: skip
    p = _mma_sub(
        p, w1, s1, b1, xs.slice(BLOCK_M, BLOCK_M), CT, BLOCK_N, BLOCK_M, A_LAYOUT,
        B_LAYOUT, X_SUB, POST_SCALE,
    )  # fmt: skip
    p = _mma_sub(
        p, w2, s2, b2, xs.slice(2 * BLOCK_M, BLOCK_M), CT, BLOCK_N, BLOCK_M, A_LAYOUT,
        B_LAYOUT, X_SUB, POST_SCALE,
    )  # fmt: skip
    p = _mma_sub(
        p, w3, s3, b3, xs.slice(3 * BLOCK_M, BLOCK_M), CT, BLOCK_N, BLOCK_M, A_LAYOUT,
        B_LAYOUT, X_SUB, POST_SCALE,
    )  # fmt: skip
    if POST_SCALE:
        acc += p * sc
    else:
        acc = p
    return acc


@gluon.jit
def _grid_wait():
    """Programmatic dependent launch (``MoETiles.pdl``; ``_kernels._grid_dependency``).

    Block until the kernel launched before this one has finished and its writes are
    visible; a no-op on a launch without PDL.
    """
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _grid_next():
    """Programmatic dependent launch (``MoETiles.pdl``): let the next kernel launch.

    It launches (if launched with ``launch_pdl``) once every program of this one has
    got here or exited; a no-op where it was not.
    """
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


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
):
    """One (row block, column tile, K split) of the grouped GEMM; see ``_moe_gemm_kernel``.

    Columns tiles in row-block-fastest order (``GemmTiles.group_m`` 0); K steps of 128.
    ``PDL`` (``MoETiles.pdl``): launched with ``launch_pdl``; every program waits for
    the kernel before it (the alignment, w13 or the activation) before its first
    read, and lets the next kernel launch after its K loop: the next kernel's
    programs then wait on multiprocessors this grid's last programs are leaving,
    not beside them for the whole of its last wave (which cost Mixtral M = 16 and 32
    4%; bench/TUNING.md, "Programmatic dependent launch on the gemm path").
    """
    if PDL:
        _grid_wait()
    W_LAYOUT: gl.constexpr = _words_layout(BLOCK_N, WARPS)
    X_LAYOUT: gl.constexpr = _input_layout(BLOCK_M, WARPS, 128)
    ACC_LAYOUT: gl.constexpr = _acc_layout(WARPS)
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(0, ACC_LAYOUT, 2)
    B_LAYOUT: gl.constexpr = gl.DotOperandLayout(1, ACC_LAYOUT, 2)
    pid = gl.program_id(0)
    tiles_n = gl.cdiv(N, BLOCK_N)
    blocks = gl.num_programs(0) // tiles_n
    pid_b = pid % blocks
    pid_n = pid // blocks
    pid_s = gl.program_id(2)
    e = gl.load(block_expert_ptr + pid_b)
    if e < expert_lo or e >= expert_hi:  # unused block (-1), or not in this chunk
        return
    n_rows = gl.load(block_rows_ptr + pid_b)
    w_e = b_ptr.to(gl.pointer_type(gl.int32)) + (e - expert_lo).to(gl.int64) * (
        stride_be // 4
    )
    s_e = scale_ptr + e.to(gl.int64) * stride_se
    z_e = zero_ptr + e.to(gl.int64) * stride_se
    stride_wn = stride_bn // 4

    # weight rows and word columns, in the words layout
    W_ROWS: gl.constexpr = gl.SliceLayout(1, W_LAYOUT)
    W_COLS: gl.constexpr = gl.SliceLayout(0, W_LAYOUT)
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=W_ROWS)
    rows = gl.expand_dims(offs_n.to(gl.int64), 1)
    row_mask = gl.expand_dims(offs_n < N, 1)
    kw = gl.expand_dims(gl.arange(0, 16, layout=W_COLS), 0)

    # input rows and columns, in the activation layout
    X_ROWS: gl.constexpr = gl.SliceLayout(1, X_LAYOUT)
    X_COLS: gl.constexpr = gl.SliceLayout(0, X_LAYOUT)
    offs_mx = gl.arange(0, BLOCK_M, layout=X_ROWS)
    pairs_x = gl.load(
        sorted_ptr + pid_b * BLOCK_M + offs_mx, mask=offs_mx < n_rows, other=0
    )
    x_rows = gl.expand_dims((pairs_x // A_DIV).to(gl.int64) * stride_am, 1)
    x_mask_m = gl.expand_dims(offs_mx < n_rows, 1)
    offs_kx = gl.expand_dims(gl.arange(0, 128, layout=X_COLS), 0)

    # accumulator rows (the epilogue's too)
    C_ROWS: gl.constexpr = gl.SliceLayout(1, ACC_LAYOUT)
    C_COLS: gl.constexpr = gl.SliceLayout(0, ACC_LAYOUT)
    offs_nc = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=C_ROWS)
    n_mask = offs_nc < N
    rows_c = offs_nc.to(gl.int64)

    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    acc_up = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC_LAYOUT)
    k_start = pid_s * k_per_split
    k_end = gl.minimum(k_start + k_per_split, K)
    # Each step loads the next step's scales and input (and, without a ring, its
    # words) before its own math; with a ring the words of STAGES - 1 copy groups of
    # COPY_STEPS steps ahead are in flight by cp.async.
    RING: gl.constexpr = STAGES > 1
    # k_end // 8; with K32 its divisibility by 4 is visible: 16-byte word loads
    w_end = k_end // 32 * 4 if K32 else k_end // 8
    X_SUB: gl.constexpr = _input_layout(BLOCK_M, WARPS, 32)
    x_base = None
    x_cmask = None
    x_col = None
    if X_SHARED:  # the activation's copy addresses, (sub-step, token, position)
        XC: gl.constexpr = _input_copy_layout(WARPS)
        offs_q = gl.arange(0, 4 * BLOCK_M, layout=gl.SliceLayout(1, XC))
        offs_p = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, XC)), 0)
        m_q = offs_q % BLOCK_M
        x_col = (
            32 * (offs_p // 8) + 8 * gl.expand_dims(offs_q // BLOCK_M, 1) + offs_p % 8
        )
        pairs_c = gl.load(
            sorted_ptr + pid_b * BLOCK_M + m_q, mask=m_q < n_rows, other=0
        )
        rows_q = gl.expand_dims((pairs_c // A_DIV).to(gl.int64) * stride_am, 1)
        x_base = a_ptr + rows_q + x_col  # [4 BLOCK_M, 32]; the copies add k0
        x_cmask = gl.expand_dims(m_q < n_rows, 1)
    if RING:
        SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        SLOTS: gl.constexpr = STAGES * COPY_STEPS
        ring = gl.allocate_shared_memory(gl.int32, [SLOTS, BLOCK_N, 16], SMEM)
        ring_up = gl.allocate_shared_memory(gl.int32, [SLOTS, BLOCK_N, 16], SMEM)
        x_ring = ring  # unused without X_SHARED
        if X_SHARED:
            x_ring = gl.allocate_shared_memory(
                a_ptr.dtype.element_ty, [SLOTS, 4 * BLOCK_M, 32], SMEM
            )
        for i in gl.static_range(STAGES - 1):
            _copy_step(
                ring, ring_up, x_ring, i, w_e, rows, row_mask, kw, k_start, w_end,
                stride_wn, N, x_base, x_cmask, x_col, k_end, GATED, STAGES, COPY_STEPS,
                X_SHARED,
            )  # fmt: skip
    it = 0
    cols = k_start + offs_kx
    x = offs_kx  # unused with X_SHARED
    if not X_SHARED:
        x = gl.load(a_ptr + x_rows + cols, mask=x_mask_m & (cols < k_end), other=0.0)
    wd, s_b, bias = _load_words(
        w_e, s_e, z_e, rows, row_mask, kw, k_start, k_end, w_end, stride_wn, stride_sn,
        GROUP, HAS_ZP, CT, POST_SCALE, RING,
    )  # fmt: skip
    sc = _row_scales(s_e, rows_c, n_mask, k_start, k_end, stride_sn, GROUP)
    wd_up, s_up, bias_up = _load_words(
        w_e, s_e, z_e, rows + N, row_mask & GATED, kw, k_start, k_end, w_end, stride_wn,
        stride_sn, GROUP, HAS_ZP, CT, POST_SCALE, RING,
    )  # fmt: skip
    sc_up = _row_scales(
        s_e, rows_c + N, n_mask & GATED, k_start, k_end, stride_sn, GROUP
    )
    for k0 in range(k_start, k_end, 128):
        nk = k0 + 128
        cols = nk + offs_kx
        if not X_SHARED:
            x_next = gl.load(
                a_ptr + x_rows + cols, mask=x_mask_m & (cols < k_end), other=0.0
            )
        wd_next, s_next, bias_next = _load_words(
            w_e, s_e, z_e, rows, row_mask, kw, nk, k_end, w_end, stride_wn, stride_sn,
            GROUP, HAS_ZP, CT, POST_SCALE, RING,
        )  # fmt: skip
        if POST_SCALE:
            sc_next = _row_scales(s_e, rows_c, n_mask, nk, k_end, stride_sn, GROUP)
        if GATED:
            wd_up_next, s_up_next, bias_up_next = _load_words(
                w_e, s_e, z_e, rows + N, row_mask, kw, nk, k_end, w_end, stride_wn,
                stride_sn, GROUP, HAS_ZP, CT, POST_SCALE, RING,
            )  # fmt: skip
            if POST_SCALE:
                sc_up_next = _row_scales(
                    s_e, rows_c + N, n_mask, nk, k_end, stride_sn, GROUP
                )
        if RING:
            # at a group's first step: copy the next group in, wait for this one
            # (the condition inline: as a variable it costs an instruction at 1)
            if COPY_STEPS == 1 or it % COPY_STEPS == 0:
                if X_SHARED:
                    # every thread reads every thread's activation copies: wait for
                    # this group, then a barrier, and only then overwrite the slots
                    # the last group was read from
                    async_copy.wait_group(STAGES - 2)
                    gl.thread_barrier()
                _copy_step(
                    ring, ring_up, x_ring, it // COPY_STEPS + STAGES - 1, w_e, rows,
                    row_mask, kw, k_start, w_end, stride_wn, N, x_base, x_cmask, x_col,
                    k_end, GATED, STAGES, COPY_STEPS, X_SHARED,
                )  # fmt: skip
                if not X_SHARED:
                    async_copy.wait_group(STAGES - 1)
            slot = it // COPY_STEPS % STAGES * COPY_STEPS + it % COPY_STEPS
            wd = ring.index(slot).load(W_LAYOUT)
            if GATED:
                wd_up = ring_up.index(slot).load(W_LAYOUT)
        it += 1  # noqa: SIM113 (a Triton range has no enumerate)
        if X_SHARED:
            xs = x_ring.index(slot)
            acc = _mma_step_shared(
                acc, wd, s_b, bias, xs, sc, CT, BLOCK_N, BLOCK_M, A_LAYOUT, B_LAYOUT,
                ACC_LAYOUT, X_SUB, POST_SCALE,
            )  # fmt: skip
        else:
            b = gl.convert_layout(_to_logical_b(x.to(CT), BLOCK_M), B_LAYOUT)
            acc = _mma_step(
                acc, wd, s_b, bias, b, sc, CT, BLOCK_N, BLOCK_M, A_LAYOUT, ACC_LAYOUT,
                POST_SCALE,
            )  # fmt: skip
        if POST_SCALE:
            sc = sc_next
        if GATED:
            if X_SHARED:
                acc_up = _mma_step_shared(
                    acc_up, wd_up, s_up, bias_up, xs, sc_up, CT, BLOCK_N, BLOCK_M,
                    A_LAYOUT, B_LAYOUT, ACC_LAYOUT, X_SUB, POST_SCALE,
                )  # fmt: skip
            else:
                acc_up = _mma_step(
                    acc_up, wd_up, s_up, bias_up, b, sc_up, CT, BLOCK_N, BLOCK_M,
                    A_LAYOUT, ACC_LAYOUT, POST_SCALE,
                )  # fmt: skip
            if POST_SCALE:
                sc_up = sc_up_next
            wd_up = wd_up_next
            s_up = s_up_next
            bias_up = bias_up_next
        if not X_SHARED:
            x = x_next
        wd = wd_next
        s_b = s_next
        bias = bias_next

    if PDL:
        _grid_next()
    # epilogue, in the accumulator's layout: acc[n, m]
    offs_mc = gl.arange(0, BLOCK_M, layout=C_COLS)
    m_mask = offs_mc < n_rows
    pairs = gl.load(sorted_ptr + pid_b * BLOCK_M + offs_mc, mask=m_mask, other=0)
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
    c_ptrs = (
        c_ptr
        + pid_s * stride_cs
        + gl.expand_dims(pairs.to(gl.int64) * stride_cm, 0)
        + gl.expand_dims(offs_nc, 1)
    )
    mask = gl.expand_dims(n_mask, 1) & gl.expand_dims(m_mask, 0)
    gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
