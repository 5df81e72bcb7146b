"""Experimental decode GEMV of bench/probe_gemv.py: packed-half products (inline PTX).

The prototype of the library's half2 word GEMV (``_kernels_gemv_words.py``), kept with
its input variants (``XMODE``) for ``PROBE_SET=h2``; symmetric weights only.

``_gemv_h2`` reads int32 words of 8 codes and turns two codes into a half2 with one
LOP3 (``0x6400`` is float16 1024: OR-ing ``q`` or ``16 q`` into its mantissa gives
``1024 + q`` / ``1024 + 16 q`` exactly), takes the zero point off with one HADD2 / HFMA2
per two codes and multiplies with one HFMA2 per two codes against the input, itself
packed as half2 pairs ``(x[8i + j], x[8i + j + 4])``. Each word's 8 products are summed
in float16 (at most 8 * 8 * 2 = 128 in size) and the two halves added in float32, so
about 2 instructions a code against the float32 word GEMV's 5.1.

Float16 products need the input in range: each step divides its input block by the
power of two at or below its largest magnitude (exact), so every scaled input is below
2 in size, and multiplies that power back into the row's scale. Values more than 2^14
below the block's largest become float16 subnormals (kept to 2^-24 of it), more than
2^25 below it zero.
"""

# ruff: noqa: TID253
# Launchers take the probe's keyword arguments (probe_gemv.py's variant tables).

import torch
import triton
import triton.language as tl

from backends.triton._kernels_gemv_words import _half2
from backends.triton._launch import ExpertMatrix

_H2_ASM = tl.constexpr("""{
.reg .b32 a, b, c, d, t, acc, kz, k16, kz16;
.reg .b16 lo, hi;
.reg .f32 flo, fhi;
mov.b32 kz, 0x64086408;
mov.b32 k16, 0x2C002C00;
mov.b32 kz16, 0xD480D480;
shr.u32 t, $1, 8;
lop3.b32 a, $1, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 b, $1, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 d, t, 0x00F000F0, 0x64006400, 0xEA;
sub.f16x2 a, a, kz;
fma.rn.f16x2 b, b, k16, kz16;
sub.f16x2 c, c, kz;
fma.rn.f16x2 d, d, k16, kz16;
mul.f16x2 acc, a, $2;
fma.rn.f16x2 acc, b, $3, acc;
fma.rn.f16x2 acc, c, $4, acc;
fma.rn.f16x2 acc, d, $5, acc;
mov.b32 {lo, hi}, acc;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 $0, flo, fhi;
}""")
"""``$0 = sum_j (code_j - 8) x_j`` of word ``$1`` against half2 pairs ``$2..$5`` =
``(x_0, x_4), (x_1, x_5), (x_2, x_6), (x_3, x_7)``. ``0x6408`` = 1032, ``0x2C00`` = 1/16,
``0xD480`` = -72: ``(1024 + 16 q) / 16 - 72 = q - 8``."""


@triton.jit
def _half2_inputs(x_ptr, wi, i_mask, K, BW: tl.constexpr, XMODE: tl.constexpr):
    """A step's input as half2 pairs ``p0..p3`` of ``_H2_ASM``, and their power of two.

    ``XMODE`` as ``_gemv_h2``'s: the pairs scaled by ``1 / pw`` (a power of two),
    or read packed and unscaled (``pw`` 1).
    """
    if XMODE == 2:
        KW = K // 8
        p0 = tl.load(x_ptr + wi, mask=i_mask, other=0)
        p1 = tl.load(x_ptr + KW + wi, mask=i_mask, other=0)
        p2 = tl.load(x_ptr + 2 * KW + wi, mask=i_mask, other=0)
        p3 = tl.load(x_ptr + 3 * KW + wi, mask=i_mask, other=0)
        pw = tl.full([1, BW], 1.0, tl.float32)
    else:
        xb = x_ptr + 8 * wi
        x0 = tl.load(xb + 0, mask=i_mask, other=0.0).to(tl.float32)
        x1 = tl.load(xb + 1, mask=i_mask, other=0.0).to(tl.float32)
        x2 = tl.load(xb + 2, mask=i_mask, other=0.0).to(tl.float32)
        x3 = tl.load(xb + 3, mask=i_mask, other=0.0).to(tl.float32)
        x4 = tl.load(xb + 4, mask=i_mask, other=0.0).to(tl.float32)
        x5 = tl.load(xb + 5, mask=i_mask, other=0.0).to(tl.float32)
        x6 = tl.load(xb + 6, mask=i_mask, other=0.0).to(tl.float32)
        x7 = tl.load(xb + 7, mask=i_mask, other=0.0).to(tl.float32)
        big = tl.maximum(
            tl.maximum(
                tl.maximum(tl.abs(x0), tl.abs(x1)),
                tl.maximum(tl.abs(x2), tl.abs(x3)),
            ),
            tl.maximum(
                tl.maximum(tl.abs(x4), tl.abs(x5)),
                tl.maximum(tl.abs(x6), tl.abs(x7)),
            ),
        )
        if XMODE == 0:
            top = tl.maximum(tl.max(big, axis=0), 1e-30)
        else:
            top = tl.maximum(big, 1e-30)
        ebits = top.to(tl.int32, bitcast=True) & 0x7F800000
        inv = (0x7F000000 - ebits).to(tl.float32, bitcast=True)
        pw = ebits.to(tl.float32, bitcast=True)
        if XMODE == 1:
            pw = pw[None, :]
        p0 = _half2(x0 * inv, x4 * inv)
        p1 = _half2(x1 * inv, x5 * inv)
        p2 = _half2(x2 * inv, x6 * inv)
        p3 = _half2(x3 * inv, x7 * inv)
    return p0, p1, p2, p3, pw


@triton.jit
def _gemv_h2(
    a_ptr, w_ptr, s_ptr, c_ptr, ids_ptr, N, K, k_per_split,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_cs, stride_cm,
    A_DIV, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    XMODE: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Symmetric int4 words (zero point 8); float32 partials.

    ``XMODE`` 0: each step's input scaled by one power of two (a cross-thread max);
    1: each word's 8 inputs by their own; 2: ``a_ptr`` holds the input already packed,
    ``xp[r, j, i]`` = half2 ``(x[8i + j], x[8i + j + 4])`` as int32, unscaled (the
    ceiling where the input costs nothing). ``EVEN``: no K masks (16-byte loads).
    """
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    BW: tl.constexpr = BLOCK_K // 8
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None]
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = s_ptr + e.to(tl.int64) * stride_se
    acc = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    offs_i = tl.arange(0, BW)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        wi = tl.multiple_of(k0 // 8, BW) + offs_i
        i_mask = wi < k_hi // 8
        if EVEN:
            i_mask = offs_i < BW
        p0, p1, p2, p3, pw = _half2_inputs(x_ptr, wi, i_mask, K, BW, XMODE)
        w_mask = n_mask[:, None] & i_mask[None, :]
        if EVEN:
            w_mask = n_mask[:, None]
        words = tl.load(w_e + rows * stride_wn + wi[None, :], mask=w_mask, other=0)
        t = tl.inline_asm_elementwise(
            _H2_ASM, "=r,r,r,r,r,r",
            [words, p0[None, :], p1[None, :], p2[None, :], p3[None, :]],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
        if BLOCK_K <= GROUP:
            sc = tl.load(
                s_e + rows * stride_sn + k0 // GROUP, mask=n_mask[:, None], other=0.0
            )
        else:
            sc = tl.load(
                s_e + rows * stride_sn + (wi // (GROUP // 8))[None, :],
                mask=n_mask[:, None],
                other=0.0,
            )
        acc += t * (sc.to(tl.float32) * pw)
    out = tl.sum(acc, axis=1)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, out, mask=n_mask)


def pack_x(x: torch.Tensor) -> torch.Tensor:
    """(R, K) -> (R, 4, K/8) int32 half2 pairs ``(x[8i + j], x[8i + j + 4])``."""
    r, k = x.shape
    h = x.half().view(r, k // 8, 2, 4).transpose(2, 3).contiguous()
    return h.view(torch.int32).view(r, k // 8, 4).transpose(1, 2).contiguous()


def h2_launch(
    x: torch.Tensor, b: ExpertMatrix, out: torch.Tensor, ids: torch.Tensor, *,
    a_div: int, bn: int, bk: int, warps: int, split: int, xmode: int = 0,
) -> object:  # fmt: skip
    """``xmode`` 2 takes ``pack_x(x)``."""
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n = words.shape[1]
    k = 8 * words.shape[2]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    even = k % bk == 0 and k_per % bk == 0 and k_per * split >= k
    grid = (pairs, triton.cdiv(n, bn), split)
    assert b.scale is not None
    return _gemv_h2[grid](
        x, words, b.scale, out, ids, n, k, k_per,
        x.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=b.group_size, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
        XMODE=xmode, EVEN=even,
    )  # fmt: skip
