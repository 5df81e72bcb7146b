# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
"""Integer products for the paired decode GEMV (``GemvTiles.int_dot``): ``dp4a``.

``@triton.jit`` only; ``_kernels_gemv_pairs.py`` calls ``_int_pair_math`` per step in
place of its float16 chains. Per step the 16 inputs of each pair of words (a column
of the step's pair tile) become integers on a power-of-two grid,
``v = round(x * 2^(13 - E))`` (``2^E`` at or below the column's largest ``|x|``, so
``|v| <= 2^14``), split into an unsigned low byte and a
signed high byte (``v = 256 hi + lo``). A word's codes become signed bytes
``16 (q - 8)`` (one shift and two LOP3 a word: a code in a byte's high nibble, its top
bit flipped), and ``dp4a`` sums four products of bytes into int32: four ``dp4a`` a word
(low and high bytes, even and odd codes), no zero-point subtraction and no float16
rounding. A pair's sum ``16 sum_j (q_j - 8) v_j`` is exact in int32 (at most ``2^25``
in size; ``2^26`` with zero points, which add ``16 (8 - z) sum_j v_j``, ``HAS_ZP``);
converted to float32 once (exact: a multiple of 16 below ``2^28``) and scaled by
``scale * 2^(E - 17)``. The only rounding before the float32 accumulation is that of
``v``: at most ``2^(E - 14)``, 2^-14 of the column's largest input (inputs within 2^6
of it, in bf16, are exact). A column whose largest input is below ``2^-109`` in size
is rounded to that grid (``2^-122``); an inf or NaN input makes its column's factor
NaN, so every output that reads it is NaN.
"""

import triton
import triton.language as tl

MAGIC: tl.constexpr = tl.constexpr(12582912.0)
"""``1.5 * 2^23``: ``y + MAGIC`` (``|y| < 2^22``) holds ``round(y)`` in the low 22 bits
of its float bits, two's complement; bytes 0 and 1 are ``v``'s low and high bytes."""
MAGIC_BITS: tl.constexpr = tl.constexpr(0x4B400000)
SIGN_BITS: tl.constexpr = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as int32

_PLANES_ASM = tl.constexpr("""{
.reg .b32 t0, t1;
prmt.b32 t0, $4, $5, 0x5140;
prmt.b32 t1, $6, $7, 0x5140;
prmt.b32 $0, t0, t1, 0x5410;
prmt.b32 $2, t0, t1, 0x7632;
prmt.b32 t0, $8, $9, 0x5140;
prmt.b32 t1, $10, $11, 0x5140;
prmt.b32 $1, t0, t1, 0x5410;
prmt.b32 $3, t0, t1, 0x7632;
}""")
"""PTX: eight ``x + MAGIC`` bit patterns (``$4..$7`` planes 0, 2, 4, 6; ``$8..$11``
planes 1, 3, 5, 7) to four byte vectors: ``$0`` / ``$1`` the even / odd planes' low
bytes, ``$2`` / ``$3`` their high bytes (byte ``k`` of each: plane ``2k`` or ``2k + 1``)."""


def _word_asm(
    word: str, lo_e: str, lo_o: str, hi_e: str, hi_o: str, *, first: bool
) -> str:
    """PTX: a word's even and odd codes as signed bytes ``16 (q - 8)``, four ``dp4a``."""
    h = "0" if first else "h"
    lo = "0" if first else "l"
    return f"""shl.b32 e, {word}, 4;
lop3.b32 e, e, 0xF0F0F0F0, 0x80808080, 0x6A;
lop3.b32 o, {word}, 0xF0F0F0F0, 0x80808080, 0x6A;
dp4a.s32.s32 h, e, {hi_e}, {h};
dp4a.s32.s32 h, o, {hi_o}, h;
dp4a.s32.u32 l, e, {lo_e}, {lo};
dp4a.s32.u32 l, o, {lo_o}, l;
"""


_PAIR_ASM = tl.constexpr(
    "{\n.reg .b32 e, o, h, l;\n"
    + _word_asm("$1", "$3", "$4", "$5", "$6", first=True)
    + _word_asm("$2", "$7", "$8", "$9", "$10", first=False)
    + "mad.lo.s32 $0, h, 256, l;\n}"
)
"""PTX: ``$0 = 16 sum_j (q_j - 8) v_j`` over words ``$1`` and ``$2`` (16 codes), with
``$3..$6`` the first word's byte vectors (``_PLANES_ASM``: even low, odd low, even
high, odd high) and ``$7..$10`` the second's. LOP3 ``0x6A`` is ``(a & b) ^ c``: the
codes in the high nibbles, the top bit flipped, read as signed bytes ``16 (q - 8)``."""


@triton.jit
def _abs_bits(x):
    """``|x|``'s float bits as int32: ordered as ``|x|``, NaN above inf."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _int_scale(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    """``(2^(13 - E), 2^(E - 17))`` per column of a step's 16 planes (a pair of words).

    ``2^E`` is the power of two at or below the column's largest ``|x|`` (found on
    the float bits, so a NaN is not dropped), ``E >= -109`` (both factors stay normal
    floats); the second factor is NaN where an input is inf or NaN.
    """
    big = tl.maximum(
        tl.maximum(tl.maximum(_abs_bits(a0), _abs_bits(a1)),
                   tl.maximum(_abs_bits(a2), _abs_bits(a3))),
        tl.maximum(tl.maximum(_abs_bits(a4), _abs_bits(a5)),
                   tl.maximum(_abs_bits(a6), _abs_bits(a7))),
    )  # fmt: skip
    big = tl.maximum(
        big,
        tl.maximum(
            tl.maximum(tl.maximum(_abs_bits(b0), _abs_bits(b1)),
                       tl.maximum(_abs_bits(b2), _abs_bits(b3))),
            tl.maximum(tl.maximum(_abs_bits(b4), _abs_bits(b5)),
                       tl.maximum(_abs_bits(b6), _abs_bits(b7))),
        ),
    )  # fmt: skip
    biased = big >> 23
    b = tl.maximum(biased, 18)
    q = ((267 - b) << 23).to(tl.float32, bitcast=True)
    out = ((b - 17) << 23).to(tl.float32, bitcast=True)
    return q, tl.where(biased < 255, out, float("nan"))


@triton.jit
def _grid_bits(x, q):
    """``x * q + MAGIC``'s bits: ``round(x * q)`` in the low bytes (``MAGIC``)."""
    return (x * q + MAGIC).to(tl.int32, bitcast=True)


@triton.jit
def _v(f):
    """``round(x * q)`` from ``_grid_bits``' pattern ``f``."""
    return f - MAGIC_BITS


@triton.jit
def _byte(v, k: tl.constexpr):
    """Byte ``k`` of int32 ``v``, unsigned."""
    return (v >> (8 * k)) & 0xFF


@triton.jit
def _signed_byte(v, k: tl.constexpr):
    """Byte ``k`` of int32 ``v``, sign-extended."""
    return (v << (24 - 8 * k)) >> 24


@triton.jit
def _bytes4(v0, v1, v2, v3):
    """Four int32 (low bytes) to one, byte ``k`` from ``v_k``."""
    return (v0 & 0xFF) | ((v1 & 0xFF) << 8) | ((v2 & 0xFF) << 16) | (v3 << 24)


@triton.jit
def _planes(f0, f1, f2, f3, f4, f5, f6, f7, ASM: tl.constexpr):
    """``_PLANES_ASM``: even low, odd low, even high, odd high byte vectors of a word."""
    if ASM:
        lo_e, lo_o, hi_e, hi_o = tl.inline_asm_elementwise(
            _PLANES_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r",
            [f0, f2, f4, f6, f1, f3, f5, f7],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1,
        )  # fmt: skip
    else:
        lo_e = _bytes4(f0, f2, f4, f6)
        lo_o = _bytes4(f1, f3, f5, f7)
        hi_e = _bytes4(f0 >> 8, f2 >> 8, f4 >> 8, f6 >> 8)
        hi_o = _bytes4(f1 >> 8, f3 >> 8, f5 >> 8, f7 >> 8)
    return lo_e, lo_o, hi_e, hi_o


@triton.jit
def _dp4a(codes, xs, acc, X_SIGNED: tl.constexpr):
    """``acc + sum_k codes_k xs_k`` over the four bytes, codes signed (plain Triton)."""
    for k in tl.static_range(4):
        if X_SIGNED:
            acc += _signed_byte(codes, k) * _signed_byte(xs, k)
        else:
            acc += _signed_byte(codes, k) * _byte(xs, k)
    return acc


@triton.jit
def _word_int(w, lo_e, lo_o, hi_e, hi_o, acc):
    """``acc + 16 sum_j (q_j - 8) v_j`` of one word, as ``_PAIR_ASM`` (plain Triton)."""
    even = ((w << 4) & -0x0F0F0F10) ^ SIGN_BITS  # & 0xF0F0F0F0
    odd = (w & -0x0F0F0F10) ^ SIGN_BITS
    hi = _dp4a(even, hi_e, tl.zeros_like(w), X_SIGNED=True)
    hi = _dp4a(odd, hi_o, hi, X_SIGNED=True)
    lo = _dp4a(even, lo_e, tl.zeros_like(w), X_SIGNED=False)
    lo = _dp4a(odd, lo_o, lo, X_SIGNED=False)
    return acc + hi * 256 + lo


@triton.jit
def _pair_int(wa, wb, xa, xb, ASM: tl.constexpr):
    """``16 sum_j (q_j - 8) v_j`` over words ``wa``, ``wb``; ``xa``, ``xb`` their planes."""
    a_lo_e, a_lo_o, a_hi_e, a_hi_o = xa
    b_lo_e, b_lo_o, b_hi_e, b_hi_o = xb
    if ASM:
        t = tl.inline_asm_elementwise(
            _PAIR_ASM, "=r,r,r,r,r,r,r,r,r,r,r",
            [wa, wb, a_lo_e[None, :], a_lo_o[None, :], a_hi_e[None, :],
             a_hi_o[None, :], b_lo_e[None, :], b_lo_o[None, :], b_hi_e[None, :],
             b_hi_o[None, :]],
            dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        t = _word_int(
            wa, a_lo_e[None, :], a_lo_o[None, :], a_hi_e[None, :], a_hi_o[None, :],
            tl.zeros_like(wa),
        )  # fmt: skip
        t = _word_int(
            wb, b_lo_e[None, :], b_lo_o[None, :], b_hi_e[None, :], b_hi_o[None, :], t
        )
    return t


@triton.jit
def _int_step(
    wa, wb, s, z, out, xa, xb, sum_v, HAS_ZP: tl.constexpr, ASM: tl.constexpr
):
    """``scale * 2^(E - 17) * 16 sum_j (q_j - z) v_j`` per element of a pair tile."""
    t = _pair_int(wa, wb, xa, xb, ASM)
    if HAS_ZP:
        t += (8 - z.to(tl.int32)) * (16 * sum_v)[None, :]
    return t.to(tl.float32) * (s.to(tl.float32) * out[None, :])


@triton.jit
def _int_pair_math(
    acc, acc_up, wa, wb, ua, ub, s, su, z, zu,
    a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
    GATED: tl.constexpr, HAS_ZP: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """One step of the paired loop on integer products: ``acc`` (and ``acc_up``) added to.

    ``wa``, ``wb`` (up: ``ua``, ``ub``) the step's pair tiles, ``s``, ``z`` their
    scales and zero points, ``a*`` / ``b*`` the 8 input planes of ``wa`` / ``wb``.
    """
    q, out = _int_scale(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7)
    fa0, fa1 = _grid_bits(a0, q), _grid_bits(a1, q)
    fa2, fa3 = _grid_bits(a2, q), _grid_bits(a3, q)
    fa4, fa5 = _grid_bits(a4, q), _grid_bits(a5, q)
    fa6, fa7 = _grid_bits(a6, q), _grid_bits(a7, q)
    fb0, fb1 = _grid_bits(b0, q), _grid_bits(b1, q)
    fb2, fb3 = _grid_bits(b2, q), _grid_bits(b3, q)
    fb4, fb5 = _grid_bits(b4, q), _grid_bits(b5, q)
    fb6, fb7 = _grid_bits(b6, q), _grid_bits(b7, q)
    xa = _planes(fa0, fa1, fa2, fa3, fa4, fa5, fa6, fa7, ASM)
    xb = _planes(fb0, fb1, fb2, fb3, fb4, fb5, fb6, fb7, ASM)
    sum_v = tl.zeros_like(fa0)
    if HAS_ZP:  # sum_j v_j of the pair's 16 planes (each at most 2^14 in size)
        sum_v = (
            (_v(fa0) + _v(fa1)) + (_v(fa2) + _v(fa3)) + (_v(fa4) + _v(fa5))
            + (_v(fa6) + _v(fa7)) + (_v(fb0) + _v(fb1)) + (_v(fb2) + _v(fb3))
            + (_v(fb4) + _v(fb5)) + (_v(fb6) + _v(fb7))
        )  # fmt: skip
    acc += _int_step(wa, wb, s, z, out, xa, xb, sum_v, HAS_ZP, ASM)
    if GATED:
        acc_up += _int_step(ua, ub, su, zu, out, xa, xb, sum_v, HAS_ZP, ASM)
    return acc, acc_up
