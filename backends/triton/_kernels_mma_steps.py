# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""The Gluon decode GEMM's parts: layouts, copies, dequantization and per-step MMAs.

``@gluon.jit`` and ``@gluon.constexpr_function`` only. ``_kernels_mma.py`` has the
kernel that puts them together, and the map of the canonical int32 words onto the
``mma.sync`` A fragment that they follow.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

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
def _x_wgmma_layout():
    """Shared slots of a step's activation ``(block_m, 128)`` for ``wgmma``'s B operand.

    K-major, 128-byte swizzle, logical K order (``_kernels_wgmma.py``).
    """
    return gl.NVMMASharedLayout(
        swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False
    )


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
