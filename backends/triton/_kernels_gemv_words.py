# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Triton decode kernel of triton-w4a16 on int32 words: the pair-major GEMV, half2 products.

``@triton.jit`` only; the typed host wrapper is ``launch_gemv`` in ``_launch_gemv.py``
(``GemvTiles.words``). Names as in ``_kernels_gemv.py``; ``W`` = int32 words of 8 codes.
"""

import triton
import triton.language as tl

from backends.triton._kernels import _grid_dependency
from backends.triton._kernels_gemv import _gemv_store, _gemv_tile

_ASM_HEAD = """{
.reg .b32 a, b, c, d, t, acc, k16;
.reg .b16 lo, hi;
.reg .f32 flo, fhi;
mov.b32 k16, 0x2C002C00;
"""
_ASM_TAIL = """mov.b32 {lo, hi}, acc;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 $0, flo, fhi;
}"""


def _codes_asm(word: str, za: str, zb: str) -> str:
    """PTX: int32 word ``word`` to half2 ``a, b, c, d`` = codes minus the zero point."""
    return f"""shr.u32 t, {word}, 8;
lop3.b32 a, {word}, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 b, {word}, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 d, t, 0x00F000F0, 0x64006400, 0xEA;
sub.f16x2 a, a, {za};
fma.rn.f16x2 b, b, k16, {zb};
sub.f16x2 c, c, {za};
fma.rn.f16x2 d, d, k16, {zb};
"""


def _products_asm(first: int, *, start: bool) -> str:
    """PTX: ``acc (+)= a, b, c, d`` times input pairs ``$first .. $first+3``."""
    ops = ["mul.f16x2 acc, a, ${}" if start else "fma.rn.f16x2 acc, a, ${}, acc"]
    ops += [f"fma.rn.f16x2 acc, {r}, ${{}}, acc" for r in "bcd"]
    return "".join(op.format(first + i) + ";\n" for i, op in enumerate(ops))


_HALF2_ASM = tl.constexpr(
    _ASM_HEAD + _codes_asm("$1", "$2", "$3") + _products_asm(4, start=True) + _ASM_TAIL
)
"""``$0 = sum_j (code_j - z) x_j`` of int32 word ``$1`` in float16 pairs, in float32.

``0x6400`` is float16 1024: one LOP3 (``(a & b) | c``) ORs two codes (or two codes
times 16) into the mantissas of a half2, giving ``1024 + q`` (``1024 + 16 q``) exactly;
``$2`` = half2 ``1024 + z`` is subtracted from the first kind, the second is scaled by
1/16 (``0x2C00``) and ``$3`` = half2 ``-(64 + z)`` added: ``q - z`` exactly, codes
``(0, 4), (1, 5), (2, 6), (3, 7)`` of the word per half2. ``$4..$7`` are the input
pairs ``(x_0, x_4), (x_1, x_5), (x_2, x_6), (x_3, x_7)``; four HFMA2 sum the eight
products in float16, the two halves are added in float32. About 2 instructions a code
(the float32 formulation took 5)."""


@triton.jit
def _half_bits(x):
    """float32 tensor -> its float16 bits in the low half of an int32 (high half 0)."""
    return x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _half2(lo, hi):
    """Two float32 tensors -> half2 ``(lo, hi)`` as int32 bits."""
    return _half_bits(lo) | (_half_bits(hi) << 16)


@triton.jit
def _x_plane(x_ptr, wi, i_mask, j: tl.constexpr):
    """``x[8 wi + j]`` in float32."""
    return tl.load(x_ptr + 8 * wi + j, mask=i_mask, other=0.0).to(tl.float32)


@triton.jit
def _step_scale(x0, x1, x2, x3, x4, x5, x6, x7):
    """``(2^E, 2^-E)``: ``2^E`` the power of two at or below the step's largest ``|x|``.

    ``x * 2^-E`` is then exact and below 2 in size. ``E`` is clamped to ``[-126, 126]``:
    a step of zeros (or float32 subnormals) takes ``2^-126`` and stays exact, an inf
    takes ``2^126`` and stays inf when scaled (both ends keep ``2^-E`` a normal float).
    """
    big = tl.maximum(
        tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3))),
        tl.maximum(tl.maximum(tl.abs(x4), tl.abs(x5)), tl.maximum(tl.abs(x6), tl.abs(x7))),
    )  # fmt: skip
    bits = tl.max(big, axis=0).to(tl.int32, bitcast=True) & 0x7F800000
    bits = tl.minimum(tl.maximum(bits, 1 << 23), 253 << 23)
    return bits.to(tl.float32, bitcast=True), (0x7F000000 - bits).to(
        tl.float32, bitcast=True
    )


@triton.jit
def _word_dot(words, z, h0, h1, h2, h3, h4, h5, h6, h7, ASM: tl.constexpr):
    """``sum_j (code_j - z) h_j`` per int32 word, ``h_j`` the scaled input planes.

    ``ASM``: ``h_j`` rounded to float16 pairs, ``_HALF2_ASM`` (products summed in
    float16); else plain Triton in float32 (the CPU interpreter, whose buffers are
    float32: on the GPU ``h_j`` hold 16-bit values, which the rounding keeps).
    """
    if ASM:
        za = _half_bits(z + 1024.0)
        zb = _half_bits(-(z + 64.0))
        t = tl.inline_asm_elementwise(
            _HALF2_ASM, "=r,r,r,r,r,r,r,r",
            [words, za | (za << 16), zb | (zb << 16), _half2(h0, h4)[None, :],
             _half2(h1, h5)[None, :], _half2(h2, h6)[None, :], _half2(h3, h7)[None, :]],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        t = ((words & 0xF).to(tl.float32) - z) * h0[None, :]
        t += (((words >> 4) & 0xF).to(tl.float32) - z) * h1[None, :]
        t += (((words >> 8) & 0xF).to(tl.float32) - z) * h2[None, :]
        t += (((words >> 12) & 0xF).to(tl.float32) - z) * h3[None, :]
        t += (((words >> 16) & 0xF).to(tl.float32) - z) * h4[None, :]
        t += (((words >> 20) & 0xF).to(tl.float32) - z) * h5[None, :]
        t += (((words >> 24) & 0xF).to(tl.float32) - z) * h6[None, :]
        t += (((words >> 28) & 0xF).to(tl.float32) - z) * h7[None, :]
    return t


@triton.jit
def _group_params(s_e, z_e, rows, g_col, s_mask, stride_sn, HAS_ZP: tl.constexpr):
    """Scales and zero points (8 without ``HAS_ZP``) of ``rows`` at ``g_col``."""
    s = tl.load(s_e + rows * stride_sn + g_col, mask=s_mask, other=0.0)
    if HAS_ZP:
        z = tl.load(z_e + rows * stride_sn + g_col, mask=s_mask, other=0)
    else:
        z = tl.full([1, 1], 8, tl.int32)
    return s, z


@triton.jit
def _word_loads(
    w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k0, k_hi, stride_wn, stride_sn,
    GROUP: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    GATED: tl.constexpr, HAS_ZP: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """One step's loads: words, scales and zero points (gate, up) and the 8 input planes.

    Masked off past ``k_hi`` (the step a prefetching loop loads after its last);
    ``EVEN`` steps have no K masks otherwise. Non-gated: the up values repeat the gate's.
    """
    BW: tl.constexpr = BLOCK_K // 8
    WG: tl.constexpr = GROUP // 8
    wi = tl.multiple_of(k0 // 8, BW) + offs_i
    row_mask = n_mask[:, None]
    if PREFETCH:
        row_mask = row_mask & (k0 < k_hi)
    if EVEN:
        i_mask = offs_i < BW
        if PREFETCH:
            i_mask = i_mask & (k0 < k_hi)
        w_mask = row_mask
    else:
        i_mask = wi < k_hi // 8
        w_mask = row_mask & i_mask[None, :]
    if BLOCK_K <= GROUP:  # one group per step (groups: powers of 2, or the row)
        g_col = tl.zeros([1, 1], dtype=tl.int32) + k0 // GROUP
        s_mask = row_mask
    else:
        g_col = (wi // WG)[None, :]
        s_mask = row_mask & i_mask[None, :]
    words = tl.load(w_e + rows * stride_wn + wi[None, :], mask=w_mask, other=0)
    s, z = _group_params(s_e, z_e, rows, g_col, s_mask, stride_sn, HAS_ZP)
    words_up = words
    s_up = s
    z_up = z
    if GATED:
        words_up = tl.load(
            w_e + up_rows * stride_wn + wi[None, :], mask=w_mask, other=0
        )
        s_up, z_up = _group_params(s_e, z_e, up_rows, g_col, s_mask, stride_sn, HAS_ZP)
    return (
        words, words_up, s, s_up, z, z_up,
        _x_plane(x_ptr, wi, i_mask, 0), _x_plane(x_ptr, wi, i_mask, 1),
        _x_plane(x_ptr, wi, i_mask, 2), _x_plane(x_ptr, wi, i_mask, 3),
        _x_plane(x_ptr, wi, i_mask, 4), _x_plane(x_ptr, wi, i_mask, 5),
        _x_plane(x_ptr, wi, i_mask, 6), _x_plane(x_ptr, wi, i_mask, 7),
    )  # fmt: skip


@triton.jit
def _word_step(
    words, s, z, pw, h0, h1, h2, h3, h4, h5, h6, h7, ASM: tl.constexpr,
):  # fmt: skip
    """``scale * 2^E * sum_j (code_j - z) h_j`` per word of a ``[BLOCK_N, BW]`` tile."""
    t = _word_dot(words, z.to(tl.float32), h0, h1, h2, h3, h4, h5, h6, h7, ASM)
    return t * (s.to(tl.float32) * pw)


@triton.jit
def _moe_gemv_words_kernel(
    # pointers
    a_ptr,
    w_ptr,
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
    # strides (w in int32 words)
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_cs,
    stride_cm,
    stride_bias,
    # meta-parameters
    A_DIV: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_ZP: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    WEIGHT_ROWS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN: tl.constexpr,
    PREFETCH: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    ASM: tl.constexpr,
    PDL_WAIT: tl.constexpr,
    PDL_NEXT: tl.constexpr,
):
    """``_moe_gemv_kernel``'s contract on int32 words, products in float16 pairs.

    Grid, K splits, ``GATED``, ``WEIGHT_ROWS`` and ``HAS_BIAS`` as there. Needs
    ``K % 8 == 0`` and ``GROUP % 8 == 0`` (``int4_words_fit``); ``EVEN``: every step is
    whole (``K`` and ``k_per_split`` multiples of ``BLOCK_K``), so no K masks (16-byte
    loads). ``PREFETCH`` issues step ``k + 1``'s loads (words, scales, zero points,
    inputs) before step ``k``'s math; ``LOOP_STAGES`` asks Triton to pipeline the K
    loop (None: its default). Per step each program reads ``BLOCK_N`` rows of
    ``BW = BLOCK_K / 8`` words and the 8 input planes ``x[8 wi + j]``, divides them by
    ``2^E``, the power of two at or below their largest magnitude (exact; every scaled
    input is below 2, so the float16 products and their sums of 8, at most 2 * 15 * 8
    in size, stay in range), and rounds them to float16: exact for the 16-bit inputs
    this kernel gets above ``2^(E-14)`` (below, float16 subnormals keep them to
    ``2^(E-24)``)::

        for each step: h_j = fp16(x_j / 2^E)
                       t[n, wi] = sum_j (code_j - z[n, g]) h_j   (_HALF2_ASM, fp16 sums)
                       acc[n, wi] += t * scale[n, g] * 2^E        (float32)
        C[s, p, n] = act(sum_wi acc, sum_wi acc_up) if gated else sum_wi acc

    Each word's sum of 8 products is rounded to float16 (11 bits): about 3e-4 relative
    error on a GEMV output against float32 math on the same values, far below int4's
    own quantization error and bf16's output rounding (2^-9).

    ``PDL_WAIT`` / ``PDL_NEXT`` (``_grid_dependency``, ``GemvTiles.pdl``): after its
    expert id each program waits for the kernel before it (the w2 GEMV, launched with
    ``launch_pdl`` behind w13: ids were written before w13 started) and lets the next
    one launch.
    """
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    _grid_dependency(PDL_WAIT, PDL_NEXT)  # GemvTiles.pdl: ids come from before w13
    BW: tl.constexpr = BLOCK_K // 8
    offs_n, n_mask, k_lo, k_hi, x_ptr, w_e, s_e, z_e = _gemv_tile(
        p, e, a_ptr, w_ptr, scale_ptr, zero_ptr, N, K, k_per_split, stride_am,
        stride_we, stride_se, A_DIV, BLOCK_N,
    )  # fmt: skip
    rows = offs_n.to(tl.int64)[:, None]
    up_rows = (offs_n + N).to(tl.int64)[:, None]
    pid_s = tl.program_id(2)
    acc = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    offs_i = tl.arange(0, BW)
    if PREFETCH:  # first step's loads; each step then loads the next before its math
        w, wu, s, su, z, zu, x0, x1, x2, x3, x4, x5, x6, x7 = _word_loads(
            w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k_lo, k_hi,
            stride_wn, stride_sn, GROUP, BLOCK_K, EVEN, GATED, HAS_ZP, PREFETCH,
        )  # fmt: skip
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=LOOP_STAGES):
        if PREFETCH:
            cw, cwu, cs, csu, cz, czu = w, wu, s, su, z, zu
            c0, c1, c2, c3, c4, c5, c6, c7 = x0, x1, x2, x3, x4, x5, x6, x7
            w, wu, s, su, z, zu, x0, x1, x2, x3, x4, x5, x6, x7 = _word_loads(
                w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k0 + BLOCK_K,
                k_hi, stride_wn, stride_sn, GROUP, BLOCK_K, EVEN, GATED, HAS_ZP,
                PREFETCH,
            )  # fmt: skip
        else:
            cw, cwu, cs, csu, cz, czu, c0, c1, c2, c3, c4, c5, c6, c7 = _word_loads(
                w_e, s_e, z_e, x_ptr, rows, up_rows, n_mask, offs_i, k0, k_hi,
                stride_wn, stride_sn, GROUP, BLOCK_K, EVEN, GATED, HAS_ZP, PREFETCH,
            )  # fmt: skip
        pw, inv = _step_scale(c0, c1, c2, c3, c4, c5, c6, c7)
        h0 = c0 * inv
        h1 = c1 * inv
        h2 = c2 * inv
        h3 = c3 * inv
        h4 = c4 * inv
        h5 = c5 * inv
        h6 = c6 * inv
        h7 = c7 * inv
        acc += _word_step(cw, cs, cz, pw, h0, h1, h2, h3, h4, h5, h6, h7, ASM)
        if GATED:
            acc_up += _word_step(cwu, csu, czu, pw, h0, h1, h2, h3, h4, h5, h6, h7, ASM)
    _gemv_store(
        tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), c_ptr, topk_weights_ptr,
        bias_ptr, p, e, pid_s, offs_n, n_mask, N, alpha, limit, stride_cs, stride_cm,
        stride_bias, GATED, ACT, WEIGHT_ROWS, HAS_BIAS,
    )  # fmt: skip
