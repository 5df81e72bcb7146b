"""Decode GEMV probe (run on the GPU): where do the int4 GEMV's cycles go?

``[PROBE_ONLY_TMA=1] python bench/probe_gemv.py time`` times, per model shape at
M = 1 (and DeepSeek-V3 at 4), each projection's GEMV alone (w13 as 2F plain rows)
under CUDA-graph replay with L2 flushed: the library's ``launch_gemv`` and
experimental kernels with K split across programs and several tiles:

- ``_gemv_probe``: the library's byte math; inner loops ``i2f`` (int-to-float),
  ``magic`` (code OR 0x4B000000 reinterpreted as float32, minus 2^23 + 8) and
  ``load`` (bytes summed as integers: the access pattern's ceiling);
- ``_gemv_word``: int32 words of 8 codes, each code masked in place and turned into
  float32 by the same exponent trick (one LOP3, FADD, FFMA per code);
- ``_gemv_tc``: codes to bf16 two per LOP3 (inline PTX), tensor-core dots;
- ``_gemv_tma``: the byte math with weight tiles streamed by TMA, 3-6 stages.

Prints achieved TB/s (weights + scales over time), registers, spills, the PTX's
widest global load, and the error against float32 math on dequantized rows.
``python bench/probe_gemv.py ncu|ncuword`` runs one forward for Nsight Compute.
Logs of runs (earlier revisions timed other variant lists): bench/sweeps/probe_*.
"""

# ruff: noqa: B023, C408, D103, E731, T201, TID253
# A GPU script: print is its output; triton kernels take untyped arguments.

import os
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import GROUP, MODELS, copy_bandwidth, random_int4, route, time_graph

from backends.triton._fused import fused_moe, pick_gemv_tiles
from backends.triton._launch import ExpertMatrix, launch_gemv
from core.config import MoEConfig


@triton.jit
def _gemv_probe(
    a_ptr, b_ptr, s_ptr, c_ptr, ids_ptr, N, K, k_per_split,
    stride_am, stride_be, stride_bn, stride_se, stride_sn, stride_cs, stride_cm,
    A_DIV, GROUP: tl.constexpr, NG: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr,
    EVEN: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None]
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    b_e = b_ptr + e.to(tl.int64) * stride_be
    s_e = s_ptr + e.to(tl.int64) * stride_se
    GK: tl.constexpr = BLOCK_K // (2 * NG)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    offs_j0 = tl.arange(0, BLOCK_K // 2)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_j = k0 // 2 + offs_j0
        j_mask = offs_j < k_hi // 2
        if EVEN:
            j_mask = offs_j0 < BLOCK_K // 2
        packed = tl.load(
            b_e + rows * stride_bn + offs_j[None, :],
            mask=n_mask[:, None] & j_mask[None, :],
            other=0,
        )
        if MODE == 9:
            acc += tl.sum(packed.to(tl.int32), axis=1).to(tl.float32)
        else:
            x_e = tl.load(x_ptr + 2 * offs_j, mask=j_mask, other=0.0).to(tl.float32)
            x_o = tl.load(x_ptr + 2 * offs_j + 1, mask=j_mask, other=0.0).to(tl.float32)
            x_e3 = tl.reshape(x_e, (NG, GK))
            x_o3 = tl.reshape(x_o, (NG, GK))
            if MODE == 0:
                lo = (packed & 0xF).to(tl.float32) - 8.0
                hi = (packed >> 4).to(tl.float32) - 8.0
            else:
                w = packed.to(tl.int32)
                lo = ((w & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
                hi = ((w >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            lo3 = tl.reshape(lo, (BLOCK_N, NG, GK))
            hi3 = tl.reshape(hi, (BLOCK_N, NG, GK))
            dot = tl.sum(lo3 * x_e3[None, :, :] + hi3 * x_o3[None, :, :], axis=2)
            offs_g = k0 // GROUP + tl.arange(0, NG)
            g_mask = n_mask[:, None] & (offs_g[None, :] < k_hi // GROUP)
            sc = tl.load(
                s_e + rows * stride_sn + offs_g[None, :], mask=g_mask, other=0.0
            )
            acc += tl.sum(sc.to(tl.float32) * dot, axis=1)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, acc, mask=n_mask)


@triton.jit
def _nib(words, xj, MASK: tl.constexpr, BIAS: tl.constexpr):
    """(q - 8) * 16^j exactly: nibble OR 2^23's exponent, reinterpreted, minus the bias."""
    v = ((words & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - BIAS
    return v * xj[None, :]


@triton.jit
def _gemv_word(
    a_ptr, w_ptr, s_ptr, c_ptr, ids_ptr, N, K, k_per_split,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_cs, stride_cm,
    A_DIV, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN: tl.constexpr, XMODE: tl.constexpr,
):  # fmt: skip
    """int32 words of 8 codes; per nibble one LOP3, one FADD, one FFMA."""
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
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = s_ptr + e.to(tl.int64) * stride_se
    acc = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    offs_i = tl.arange(0, BW)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        wi = tl.multiple_of(k0 // 8, BW) + offs_i
        if EVEN:
            i_mask = offs_i < BW
            words = tl.load(
                w_e + rows * stride_wn + wi[None, :], mask=n_mask[:, None], other=0
            )
        else:
            i_mask = wi < k_hi // 8
            words = tl.load(
                w_e + rows * stride_wn + wi[None, :],
                mask=n_mask[:, None] & i_mask[None, :],
                other=0,
            )
        if XMODE == 0:
            xb = x_ptr + 8 * wi
            x0 = tl.load(xb + 0, mask=i_mask, other=0.0).to(tl.float32)
            x1 = tl.load(xb + 1, mask=i_mask, other=0.0).to(tl.float32)
            x2 = tl.load(xb + 2, mask=i_mask, other=0.0).to(tl.float32)
            x3 = tl.load(xb + 3, mask=i_mask, other=0.0).to(tl.float32)
            x4 = tl.load(xb + 4, mask=i_mask, other=0.0).to(tl.float32)
            x5 = tl.load(xb + 5, mask=i_mask, other=0.0).to(tl.float32)
            x6 = tl.load(xb + 6, mask=i_mask, other=0.0).to(tl.float32)
            x7 = tl.load(xb + 7, mask=i_mask, other=0.0).to(tl.float32)
        else:
            x8 = tl.load(
                x_ptr + 8 * wi[:, None] + tl.arange(0, 8)[None, :],
                mask=i_mask[:, None],
                other=0.0,
            ).to(tl.float32)
            t = tl.reshape(x8, (BW, 2, 2, 2))
            t0, t1 = tl.split(t)
            t00, t01 = tl.split(t0)
            t10, t11 = tl.split(t1)
            x0, x4 = tl.split(t00)
            x2, x6 = tl.split(t01)
            x1, x5 = tl.split(t10)
            x3, x7 = tl.split(t11)
        hi = words >> 12
        part = _nib(words, x0, 0xF, 8388616.0)
        part += _nib(words, x1 * 0.0625, 0xF0, 8388736.0)
        part += _nib(words, x2 * 0.00390625, 0xF00, 8390656.0)
        part += _nib(words, x3 * 0.000244140625, 0xF000, 8421376.0)
        part += _nib(words, x4 * 0.0000152587890625, 0xF0000, 8912896.0)
        part += _nib(hi, x5 * 0.00390625, 0xF00, 8390656.0)
        part += _nib(hi, x6 * 0.000244140625, 0xF000, 8421376.0)
        part += _nib(hi, x7 * 0.0000152587890625, 0xF0000, 8912896.0)
        sc = tl.load(
            s_e + rows * stride_sn + (wi // WG)[None, :],
            mask=n_mask[:, None] & i_mask[None, :],
            other=0.0,
        )
        acc += part * sc.to(tl.float32)
    out = tl.sum(acc, axis=1)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, out, mask=n_mask)


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


def tc_launch(x, b: ExpertMatrix, out, ids, *, a_div, bn, bk, warps, split):
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n = words.shape[1]
    k = 8 * words.shape[2]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    grid = (pairs, triton.cdiv(n, bn), split)
    return _gemv_tc[grid](
        x, words, b.scale, out, ids, n, k, k_per,
        x.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=GROUP, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
    )  # fmt: skip


@triton.jit
def _gemv_tma(
    a_ptr, w_desc, s_ptr, c_ptr, ids_ptr, N, K, k_per_split,
    stride_am, stride_se, stride_sn, stride_cs, stride_cm,
    A_DIV, GROUP: tl.constexpr, NG: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """The library's byte math, weight tiles streamed by TMA (``STAGES`` deep)."""
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    n0 = tl.program_id(1) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None]
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    s_e = s_ptr + e.to(tl.int64) * stride_se
    GK: tl.constexpr = BLOCK_K // (2 * NG)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    offs_j0 = tl.arange(0, BLOCK_K // 2)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        offs_j = k0 // 2 + offs_j0
        packed = w_desc.load([e.to(tl.int32) * N + n0, k0 // 2])
        x_e = tl.load(x_ptr + 2 * offs_j).to(tl.float32)
        x_o = tl.load(x_ptr + 2 * offs_j + 1).to(tl.float32)
        x_e3 = tl.reshape(x_e, (NG, GK))
        x_o3 = tl.reshape(x_o, (NG, GK))
        lo = tl.reshape((packed & 0xF).to(tl.float32) - 8.0, (BLOCK_N, NG, GK))
        hi = tl.reshape((packed >> 4).to(tl.float32) - 8.0, (BLOCK_N, NG, GK))
        dot = tl.sum(lo * x_e3[None, :, :] + hi * x_o3[None, :, :], axis=2)
        offs_g = k0 // GROUP + tl.arange(0, NG)
        sc = tl.load(
            s_e + rows * stride_sn + offs_g[None, :], mask=n_mask[:, None], other=0.0
        )
        acc += tl.sum(sc.to(tl.float32) * dot, axis=1)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, acc, mask=n_mask)


def tma_launch(x, b: ExpertMatrix, out, ids, *, a_div, bn, bk, warps, split, stages):
    from triton.tools.tensor_descriptor import TensorDescriptor

    pairs = ids.numel()
    e, n, half = b.data.shape
    k = 2 * half
    flat = b.data.view(e * n, half)
    desc = TensorDescriptor.from_tensor(flat, [bn, bk // 2])
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    ng = bk // GROUP if bk > GROUP else 1
    grid = (pairs, triton.cdiv(n, bn), split)
    return _gemv_tma[grid](
        x, desc, b.scale, out, ids, n, k, k_per,
        x.stride(0), b.scale.stride(0), b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=GROUP, NG=ng, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages,
        num_warps=warps,
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


def word2_launch(xs, b: ExpertMatrix, out, ids, *, a_div, bn, bk, warps, split):
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n = words.shape[1]
    k = 8 * words.shape[2]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    grid = (pairs, triton.cdiv(n, bn), split)
    return _gemv_word2[grid](
        xs, words, b.scale, out, ids, n, k, k_per,
        xs.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=GROUP, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
    )  # fmt: skip


def word_launch(x, b: ExpertMatrix, out, ids, *, a_div, bn, bk, warps, split, xmode):
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n = words.shape[1]
    k = 8 * words.shape[2]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    even = k % bk == 0 and k_per % bk == 0 and (k_per * split == k or k % k_per == 0)
    grid = (pairs, triton.cdiv(n, bn), split)
    return _gemv_word[grid](
        x, words, b.scale, out, ids, n, k, k_per,
        x.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=GROUP, BLOCK_N=bn, BLOCK_K=bk, EVEN=even, XMODE=xmode,
        num_warps=warps,
    )  # fmt: skip


def probe_launch(x, b: ExpertMatrix, out, ids, *, a_div, bn, bk, warps, split, mode):
    pairs = ids.numel()
    n, half = b.data.shape[1], b.data.shape[2]
    k = 2 * half
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    ng = bk // GROUP if bk > GROUP else 1
    grid = (pairs, triton.cdiv(n, bn), split)
    return _gemv_probe[grid](
        x, b.data, b.scale, out, ids, n, k, k_per,
        x.stride(0), b.data.stride(0), b.data.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=GROUP, NG=ng, BLOCK_N=bn, BLOCK_K=bk, MODE=mode,
        EVEN=k % bk == 0 and k_per % bk == 0, num_warps=warps,
    )  # fmt: skip


def check(got, a, b: ExpertMatrix, ids, a_div) -> float:
    """Relative error of pairs 0 and -1 against float32 math on dequantized rows."""
    worst = 0.0
    for p in (0, ids.numel() - 1):
        q = b.data[int(ids[p])]
        codes = torch.stack([q & 15, q >> 4], -1).reshape(q.shape[0], -1).float() - 8
        w = codes * b.scale[int(ids[p])].float().repeat_interleave(GROUP, dim=1)
        ref = w @ a[p // a_div].float()
        worst = max(worst, float((got[p] - ref).norm() / ref.norm()))
    return worst


def describe(compiled) -> str:
    ptx = compiled.asm.get("ptx", "")
    widths = re.findall(r"ld\.global(?:\.\w+)*?\.v(\d)\.b(\d+)", ptx)
    widest = max((int(v) * int(b) // 8 for v, b in widths), default=0)
    return f"regs {compiled.n_regs:3d} spills {compiled.n_spills} ldB {widest}"


VARIANTS = [  # (block_n, block_k, warps, split)
    (16, 512, 4, 1), (16, 512, 4, 4),
]  # fmt: skip
MODES = {"i2f": 0, "magic": 1, "load": 9}
WORD_VARIANTS = [  # (block_n, block_k, warps); split: auto
    (32, 256, 4), (64, 256, 4), (128, 128, 4), (64, 256, 2),
]  # fmt: skip
ONLY_TMA = os.environ.get("PROBE_ONLY_TMA") == "1"
PROBE_SET = os.environ.get("PROBE_SET", "")
WORD2_VARIANTS = [  # (block_n, block_k, warps); split: auto
    (128, 128, 4), (256, 128, 8), (64, 128, 4), (128, 128, 8), (64, 256, 4),
    (128, 256, 4), (32, 128, 2), (64, 128, 2),
]  # fmt: skip
TMA_VARIANTS = [  # (block_n, block_k, warps, stages)
    (16, 512, 4, 3), (16, 512, 4, 5), (32, 256, 4, 4), (16, 256, 4, 6),
    (64, 256, 4, 3), (32, 512, 8, 3), (8, 512, 2, 6),
]  # fmt: skip
TC_VARIANTS = [  # (block_n, block_k, warps); split: auto
    (64, 128, 4), (128, 128, 4), (64, 256, 4), (128, 256, 8), (128, 128, 8),
    (256, 128, 8),
]  # fmt: skip


def auto_split(pairs: int, n: int, k: int, bn: int, bk: int) -> int:
    split = 1
    while pairs * triton.cdiv(n, bn) * split < 2048 and k // (2 * split) >= bk:
        split *= 2
    return split


CASES = [("mixtral-8x7b", 1), ("qwen3-235b-a22b", 1), ("deepseek-v3", 1),
         ("qwen3-30b-a3b", 1)]  # fmt: skip


def time_case(name: str, m: int) -> None:
    e, k, d, f = MODELS[name]
    torch.manual_seed(0)
    q = random_int4(e, d, f)
    w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    r = route(m, e, k)
    ids = r.topk_ids.flatten().contiguous()
    uniq = int(torch.unique(ids).numel())
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    inter = torch.randn(ids.numel(), f, device="cuda").to(torch.bfloat16)
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    routing = type(r)(topk_weights=r.topk_weights.float(), topk_ids=r.topk_ids)
    for proj, b, a, a_div in (("w13", w13, x, k), ("w2", w2, inter, 1)):
        n, half = b.data.shape[1], b.data.shape[2]
        nbytes = uniq * n * half * (1 + 4 / GROUP)
        tiles = pick_gemv_tiles(ids.numel())
        if proj == "w13":
            lib = torch.empty(ids.numel(), f, dtype=torch.bfloat16, device="cuda")
            fn = lambda: launch_gemv(a, b, lib, n=f, routing=routing, config=cfg,
                                     gated=True, tiles=tiles)  # fmt: skip
        else:
            lib = torch.empty(ids.numel(), d, dtype=torch.bfloat16, device="cuda")
            fn = lambda: launch_gemv(a, b, lib, n=d, routing=routing, config=cfg,
                                     gated=False, tiles=tiles)  # fmt: skip
        ms = time_graph(fn)
        print(f"{name:15s} M={m} {proj:3s} library {tiles.block_n}x{tiles.block_k}"
              f" w{tiles.num_warps}: {ms * 1e3:7.1f} us {nbytes / ms / 1e9:5.2f} TB/s",
              flush=True)  # fmt: skip
        if PROBE_SET == "word2":
            xs = prescale_x(a)
            for bn, bk, warps in WORD2_VARIANTS:
                split = auto_split(ids.numel(), n, 2 * half, bn, bk)
                out = torch.empty(split, ids.numel(), n, device="cuda")
                kw = {
                    "a_div": a_div,
                    "bn": bn,
                    "bk": bk,
                    "warps": warps,
                    "split": split,
                }
                try:
                    compiled = word2_launch(xs, b, out, ids, **kw)
                    err = check(out.sum(0), a, b, ids, a_div)
                    ms = time_graph(lambda kw=kw: word2_launch(xs, b, out, ids, **kw))
                except Exception as exc:  # a variant may not compile
                    print(f"  word2 {bn}x{bk} w{warps}: FAILED {exc}"[:300])
                    continue
                print(f"{name:15s} M={m} {proj:3s} {bn:3d}x{bk:4d} w{warps} s{split}"
                      f" word2  : {ms * 1e3:7.1f} us "
                      f"{nbytes / ms / 1e9:5.2f} TB/s  {describe(compiled)} err {err:.1e}",
                      flush=True)  # fmt: skip
            continue
        for bn, bk, warps, stages in TMA_VARIANTS:
            for split in sorted({1, auto_split(ids.numel(), n, 2 * half, bn, bk)}):
                out = torch.empty(split, ids.numel(), n, device="cuda")
                kw = {"a_div": a_div, "bn": bn, "bk": bk, "warps": warps,
                      "split": split, "stages": stages}  # fmt: skip
                try:
                    compiled = tma_launch(a, b, out, ids, **kw)
                    err = check(out.sum(0), a, b, ids, a_div)
                    ms = time_graph(lambda kw=kw: tma_launch(a, b, out, ids, **kw))
                except Exception as exc:  # a variant may not compile
                    print(f"  tma {bn}x{bk} w{warps}: FAILED {exc}"[:300])
                    continue
                print(f"{name:15s} M={m} {proj:3s} {bn:3d}x{bk:4d} w{warps} s{split}"
                      f" tma st{stages}: {ms * 1e3:7.1f} us "
                      f"{nbytes / ms / 1e9:5.2f} TB/s  {describe(compiled)} err {err:.1e}",
                      flush=True)  # fmt: skip
        if ONLY_TMA:
            continue
        for bn, bk, warps, split in VARIANTS:
            out = torch.empty(split, ids.numel(), n, device="cuda")
            for mode_name, mode in MODES.items():
                kw = dict(a_div=a_div, bn=bn, bk=bk, warps=warps, split=split,
                          mode=mode)  # fmt: skip
                try:
                    compiled = probe_launch(a, b, out, ids, **kw)
                    err = check(out.sum(0), a, b, ids, a_div) if mode != 9 else 0.0
                    ms = time_graph(lambda kw=kw: probe_launch(a, b, out, ids, **kw))
                except Exception as exc:  # a variant may not compile
                    print(
                        f"  {bn}x{bk} w{warps} s{split} {mode_name}: FAILED {exc}"[:200]
                    )
                    continue
                print(f"{name:15s} M={m} {proj:3s} {bn:2d}x{bk:4d} w{warps} s{split}"
                      f" {mode_name:5s}: {ms * 1e3:7.1f} us "
                      f"{nbytes / ms / 1e9:5.2f} TB/s  {describe(compiled)} err {err:.1e}",
                      flush=True)  # fmt: skip
        for bn, bk, warps in WORD_VARIANTS:
            split = auto_split(ids.numel(), n, 2 * half, bn, bk)
            out = torch.empty(split, ids.numel(), n, device="cuda")
            for xmode in (0,):
                kw = {"a_div": a_div, "bn": bn, "bk": bk, "warps": warps,
                      "split": split, "xmode": xmode}  # fmt: skip
                try:
                    compiled = word_launch(a, b, out, ids, **kw)
                    err = check(out.sum(0), a, b, ids, a_div)
                    ms = time_graph(lambda kw=kw: word_launch(a, b, out, ids, **kw))
                except Exception as exc:  # a variant may not compile
                    print(f"  word {bn}x{bk} w{warps} x{xmode}: FAILED {exc}"[:300])
                    continue
                print(f"{name:15s} M={m} {proj:3s} {bn:3d}x{bk:4d} w{warps} s{split}"
                      f" word x{xmode}: {ms * 1e3:7.1f} us "
                      f"{nbytes / ms / 1e9:5.2f} TB/s  {describe(compiled)} err {err:.1e}",
                      flush=True)  # fmt: skip
        for bn, bk, warps in TC_VARIANTS:
            split = auto_split(ids.numel(), n, 2 * half, bn, bk)
            out = torch.empty(split, ids.numel(), n, device="cuda")
            kw = {"a_div": a_div, "bn": bn, "bk": bk, "warps": warps, "split": split}
            try:
                compiled = tc_launch(a, b, out, ids, **kw)
                err = check(out.sum(0), a, b, ids, a_div)
                ms = time_graph(lambda kw=kw: tc_launch(a, b, out, ids, **kw))
            except Exception as exc:  # a variant may not compile
                print(f"  tc {bn}x{bk} w{warps}: FAILED {exc}"[:300])
                continue
            print(f"{name:15s} M={m} {proj:3s} {bn:3d}x{bk:4d} w{warps} s{split}"
                  f" tc     : {ms * 1e3:7.1f} us "
                  f"{nbytes / ms / 1e9:5.2f} TB/s  {describe(compiled)} err {err:.1e}",
                  flush=True)  # fmt: skip
    del q
    torch.cuda.empty_cache()


def ncu_case(name: str, m: int) -> None:
    e, k, d, f = MODELS[name]
    q = random_int4(e, d, f)
    w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    r = route(m, e, k)
    fused_moe(x, w13, w2, r, cfg)
    torch.cuda.synchronize()
    print(f"ncu case {name} M={m}", flush=True)


def main() -> None:
    if sys.argv[1] == "ncuword":
        e, k, d, f = MODELS["mixtral-8x7b"]
        q = random_int4(e, d, f)
        b = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
        ids = route(1, e, k).topk_ids.flatten().contiguous()
        x = torch.randn(1, d, device="cuda").to(torch.bfloat16)
        for bn, bk, warps in ((128, 256, 4), (64, 256, 4)):
            split = auto_split(2, 2 * f, d, bn, bk)
            out = torch.empty(split, 2, 2 * f, device="cuda")
            word_launch(x, b, out, ids, a_div=k, bn=bn, bk=bk, warps=warps,
                        split=split, xmode=0)  # fmt: skip
        torch.cuda.synchronize()
        return
    if sys.argv[1] == "ncu":
        for name, m in (("mixtral-8x7b", 1), ("mixtral-8x7b", 16)):
            ncu_case(name, m)
        return
    print(f"copy {copy_bandwidth() / 1e12:.2f} TB/s", flush=True)
    for name, m in CASES:
        time_case(name, m)


if __name__ == "__main__":
    main()
