# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# mypy: disable-error-code="possibly-undefined"
"""Weight-tile loaders of the grouped GEMM (``@triton.jit`` only), three dequantizations.

``_load_weight_tile`` (bytes, nibbles interleaved), ``_load_weight_halves`` (low and
high nibbles as two halves against a K-permuted input) and ``_load_weight_words``
(int32 words, one inline-PTX block a word; ``_load_weight_in_order`` picks between
it and the first) each return an expert's int4 or 16-bit ``(BLOCK_N, BLOCK_K)`` tile
in registers.
"""

import triton
import triton.language as tl


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


def word_asm_for(template: str, *, bf16: bool) -> str:
    """``template`` (``_WORD_ASM`` or a variant) for bf16 or fp16 float pairs."""
    magic, one, x2 = (
        ("0x43004300", "0x3f803f80", "bf16x2")
        if bf16
        else ("0x64006400", "0x3c003c00", "f16x2")
    )
    return template.replace("MAGIC", magic).replace("ONE", one).replace("X2", x2)


_BF16_WORD_ASM = tl.constexpr(word_asm_for(_WORD_ASM, bf16=True))
_FP16_WORD_ASM = tl.constexpr(word_asm_for(_WORD_ASM, bf16=False))


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
        BF16: tl.constexpr = CT == tl.bfloat16  # noqa: SIM300 (CT is a constexpr)
        s_b = tl.broadcast_to(s.to(CT), (BLOCK_N, NW))
        bias = tl.broadcast_to(
            (-(z + (128.0 if BF16 else 1024.0))).to(CT), (BLOCK_N, NW)
        )
        p0, p1, p2, p3, p4, p5, p6, p7 = tl.inline_asm_elementwise(
            _BF16_WORD_ASM if BF16 else _FP16_WORD_ASM,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, s_b, bias],
            dtype=(CT.value,) * 8, is_pure=True, pack=1,
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
def _load_weight_in_order(
    b_ptr,
    scale_ptr,
    zero_ptr,
    offs_n,
    n_mask,
    k0,
    K,
    K_WORDS,
    stride_bn,
    stride_sn,
    GROUP: tl.constexpr,
    INT4: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CT: tl.constexpr,
    WORDS: tl.constexpr,
    ASM: tl.constexpr,
):
    """A tile with K in order: from int32 words if ``WORDS``, else byte by byte."""
    if WORDS:
        w = _load_weight_words(
            b_ptr, scale_ptr, zero_ptr, offs_n, n_mask, k0, K_WORDS, stride_bn,
            stride_sn, GROUP, HAS_ZP, BLOCK_N, BLOCK_K, CT, ASM,
        )  # fmt: skip
    else:
        w = _load_weight_tile(
            b_ptr, scale_ptr, zero_ptr, offs_n, n_mask, k0, K, stride_bn, stride_sn,
            GROUP, INT4, HAS_ZP, BLOCK_N, BLOCK_K, CT,
        )  # fmt: skip
    return w
