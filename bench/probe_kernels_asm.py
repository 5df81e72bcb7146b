"""Experimental decode GEMV kernels of bench/probe_gemv.py that use inline PTX.

``_gemv_tc`` (codes to bf16 two per LOP3, tensor-core dots) and ``_gemv_word2`` (one
LOP3 per code into float32, x prescaled and code-major: ``prescale_x``). Not runnable
in Triton's CPU interpreter.
"""

# ruff: noqa: D103, TID253
# Launchers take the probe's keyword arguments (probe_gemv.py's variant tables).

import torch
import triton
import triton.language as tl

from backends.triton._launch import ExpertMatrix

_DQ8 = tl.constexpr("""{
.reg .b32 t0, t1, t2, t3, w1;
lop3.b32 t0, $8, 0x000F000F, 0x43004300, 0xEA;
shr.u32 w1, $8, 4;
lop3.b32 t1, w1, 0x000F000F, 0x43004300, 0xEA;
shr.u32 w1, $8, 8;
lop3.b32 t2, w1, 0x000F000F, 0x43004300, 0xEA;
shr.u32 w1, $8, 12;
lop3.b32 t3, w1, 0x000F000F, 0x43004300, 0xEA;
mov.b32 {$0, $4}, t0;
mov.b32 {$1, $5}, t1;
mov.b32 {$2, $6}, t2;
mov.b32 {$3, $7}, t3;
}""")


@triton.jit
def _dq8(words):
    """8 bf16 tensors: 128 + code j of each int32 word (two codes per LOP3)."""
    return tl.inline_asm_elementwise(
        _DQ8, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words],
        dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _xcol(xb, J: tl.constexpr, offs_t):
    xj = tl.load(xb + J).to(tl.bfloat16)
    return tl.where(offs_t[None, :] == 0, xj[:, None], 0.0).to(tl.bfloat16)


@triton.jit
def _gemv_tc(
    a_ptr, w_ptr, s_ptr, c_ptr, ids_ptr, N, K, k_per_split,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_cs, stride_cm,
    A_DIV, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Tensor-core GEMV: codes to bf16 (128 + q), two per LOP3, 8 dots per step.

    One dot per code position, x permuted to match; scale and bias after the dot.
    Needs ``BLOCK_K <= GROUP``.
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
    offs_i = tl.arange(0, BW)
    offs_t = tl.arange(0, 16)
    acc = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kw = tl.multiple_of(k0 // 8, BW)
        words = tl.load(w_e + rows * stride_wn + (kw + offs_i)[None, :],
                        mask=n_mask[:, None], other=0)  # fmt: skip
        q0, q1, q2, q3, q4, q5, q6, q7 = _dq8(words)
        xb = x_ptr + 8 * (kw + offs_i)
        part = tl.dot(q0, _xcol(xb, 0, offs_t))
        part = tl.dot(q1, _xcol(xb, 1, offs_t), part)
        part = tl.dot(q2, _xcol(xb, 2, offs_t), part)
        part = tl.dot(q3, _xcol(xb, 3, offs_t), part)
        part = tl.dot(q4, _xcol(xb, 4, offs_t), part)
        part = tl.dot(q5, _xcol(xb, 5, offs_t), part)
        part = tl.dot(q6, _xcol(xb, 6, offs_t), part)
        part = tl.dot(q7, _xcol(xb, 7, offs_t), part)
        xk = tl.load(x_ptr + k0 + tl.arange(0, BLOCK_K)).to(tl.float32)
        xsum = tl.sum(xk, axis=0)
        sc = tl.load(
            s_e + rows * stride_sn + k0 // GROUP, mask=n_mask[:, None], other=0.0
        )
        acc += sc.to(tl.float32) * (part - 136.0 * xsum)
    out = tl.sum(tl.where(offs_t[None, :] == 0, acc, 0.0), axis=1)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, out, mask=n_mask)


def tc_launch(
    x: torch.Tensor, b: ExpertMatrix, out: torch.Tensor, ids: torch.Tensor, *,
    a_div: int, bn: int, bk: int, warps: int, split: int,
) -> object:  # fmt: skip
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n = words.shape[1]
    k = 8 * words.shape[2]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    grid = (pairs, triton.cdiv(n, bn), split)
    assert b.scale is not None
    return _gemv_tc[grid](
        x, words, b.scale, out, ids, n, k, k_per,
        x.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=b.group_size, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
    )  # fmt: skip


_W8F = tl.constexpr("""{
.reg .b32 h;
lop3.b32 $0, $8, 0xF, $9, 0xEA;
lop3.b32 $1, $8, 0xF0, $9, 0xEA;
lop3.b32 $2, $8, 0xF00, $9, 0xEA;
lop3.b32 $3, $8, 0xF000, $9, 0xEA;
lop3.b32 $4, $8, 0xF0000, $9, 0xEA;
shr.u32 h, $8, 12;
lop3.b32 $5, h, 0xF00, $9, 0xEA;
lop3.b32 $6, h, 0xF000, $9, 0xEA;
lop3.b32 $7, h, 0xF0000, $9, 0xEA;
}""")
"""The library's float32 word GEMV block before the half2 one (one LOP3 a code).

Nibble ``j`` of word ``$8`` kept in place under the exponent bits of float32 ``2^23``
(``$9`` = 0x4B000000: OR-ing an integer below ``2^23`` into its mantissa gives ``2^23 +``
that integer exactly): ``$j`` = ``2^23 + code_j * 16^s_j``, one LOP3 (``(a & b) | c``)
a code, with ``s_j`` = 0, 1, 2, 3, 4 for nibbles 0-4 and 2, 3, 4 for nibbles 5-7 (taken
from the word shifted right by 12)."""


@triton.jit
def _w8f(words):
    """Eight float32 of each word: 2^23 + code j * 16^(j or j - 3), one LOP3 each."""
    magic = tl.full(words.shape, 0x4B000000, tl.int32)
    return tl.inline_asm_elementwise(
        _W8F, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [words, magic],
        dtype=(tl.float32,) * 8, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _gemv_word2(
    xs_ptr, w_ptr, s_ptr, c_ptr, ids_ptr, N, K, k_per_split,
    stride_xr, stride_we, stride_wn, stride_se, stride_sn, stride_cs, stride_cm,
    A_DIV, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Words of 8 codes, one LOP3 + FADD + FFMA per code; x prescaled, code-major.

    ``xs[r, j, i] = x[r, 8 i + j] / 16^(j or j - 3)`` in float32 (``K / 8`` per j).
    """
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    BW: tl.constexpr = BLOCK_K // 8
    WG: tl.constexpr = GROUP // 8
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None]
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = xs_ptr + (p // A_DIV).to(tl.int64) * stride_xr
    KW = K // 8
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = s_ptr + e.to(tl.int64) * stride_se
    acc = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    offs_i = tl.arange(0, BW)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        wi = tl.multiple_of(k0 // 8, BW) + offs_i
        words = tl.load(
            w_e + rows * stride_wn + wi[None, :], mask=n_mask[:, None], other=0
        )
        v0, v1, v2, v3, v4, v5, v6, v7 = _w8f(words)
        t = (v0 - 8388616.0) * tl.load(x_ptr + wi)[None, :]
        t += (v1 - 8388736.0) * tl.load(x_ptr + KW + wi)[None, :]
        t += (v2 - 8390656.0) * tl.load(x_ptr + 2 * KW + wi)[None, :]
        t += (v3 - 8421376.0) * tl.load(x_ptr + 3 * KW + wi)[None, :]
        t += (v4 - 8912896.0) * tl.load(x_ptr + 4 * KW + wi)[None, :]
        t += (v5 - 8390656.0) * tl.load(x_ptr + 5 * KW + wi)[None, :]
        t += (v6 - 8421376.0) * tl.load(x_ptr + 6 * KW + wi)[None, :]
        t += (v7 - 8912896.0) * tl.load(x_ptr + 7 * KW + wi)[None, :]
        if BLOCK_K <= GROUP:  # one group per step: one scale per row
            sc = tl.load(
                s_e + rows * stride_sn + k0 // GROUP, mask=n_mask[:, None], other=0.0
            )
        else:
            sc = tl.load(
                s_e + rows * stride_sn + (wi // WG)[None, :],
                mask=n_mask[:, None],
                other=0.0,
            )
        acc += t * sc.to(tl.float32)
    out = tl.sum(acc, axis=1)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, out, mask=n_mask)


XSCALE = [1.0, 1 / 16, 1 / 256, 1 / 4096, 1 / 65536, 1 / 256, 1 / 4096, 1 / 65536]


def prescale_x(x: torch.Tensor) -> torch.Tensor:
    """(R, K) -> (R, 8, K/8) float32 code-major, scaled per code position."""
    r, k = x.shape
    sc = torch.tensor(XSCALE, device=x.device)
    return (x.float().view(r, k // 8, 8) * sc).transpose(1, 2).contiguous()


def word2_launch(
    xs: torch.Tensor, b: ExpertMatrix, out: torch.Tensor, ids: torch.Tensor, *,
    a_div: int, bn: int, bk: int, warps: int, split: int,
) -> object:  # fmt: skip
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n = words.shape[1]
    k = 8 * words.shape[2]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    grid = (pairs, triton.cdiv(n, bn), split)
    assert b.scale is not None
    return _gemv_word2[grid](
        xs, words, b.scale, out, ids, n, k, k_per,
        xs.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=b.group_size, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
    )  # fmt: skip
