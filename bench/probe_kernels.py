"""Experimental decode GEMV kernels of bench/probe_gemv.py (plain Triton).

``_gemv_probe`` (the library's byte math; ``MODE`` 0 int-to-float, 1 exponent-bit
codes, 9 bytes summed only), ``_gemv_word`` (int32 words of 8 codes) and ``_gemv_tma``
(byte math, weight tiles streamed by TMA); each writes float32 K-split partials.
"""

# ruff: noqa: D103, TID253
# Launchers take the probe's keyword arguments (probe_gemv.py's variant tables).

import torch
import triton
import triton.language as tl

from backends.triton._launch import ExpertMatrix


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
def _inputs8(x_ptr, wi, i_mask, BW: tl.constexpr, XMODE: tl.constexpr):
    """The input at ``8 wi + j`` for each word ``wi``, ``j`` = 0..7, in float32.

    ``XMODE`` 0: eight strided loads; else one ``(BW, 8)`` load split in registers.
    """
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
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _word_products(words, x0, x1, x2, x3, x4, x5, x6, x7):
    """``sum_j (q_j - 8) x_j`` per word, one LOP3, FADD and FFMA a nibble (``_nib``)."""
    hi = words >> 12
    part = _nib(words, x0, 0xF, 8388616.0)
    part += _nib(words, x1 * 0.0625, 0xF0, 8388736.0)
    part += _nib(words, x2 * 0.00390625, 0xF00, 8390656.0)
    part += _nib(words, x3 * 0.000244140625, 0xF000, 8421376.0)
    part += _nib(words, x4 * 0.0000152587890625, 0xF0000, 8912896.0)
    part += _nib(hi, x5 * 0.00390625, 0xF00, 8390656.0)
    part += _nib(hi, x6 * 0.000244140625, 0xF000, 8421376.0)
    part += _nib(hi, x7 * 0.0000152587890625, 0xF0000, 8912896.0)
    return part


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
        x0, x1, x2, x3, x4, x5, x6, x7 = _inputs8(x_ptr, wi, i_mask, BW, XMODE)
        part = _word_products(words, x0, x1, x2, x3, x4, x5, x6, x7)
        sc = tl.load(
            s_e + rows * stride_sn + (wi // WG)[None, :],
            mask=n_mask[:, None] & i_mask[None, :],
            other=0.0,
        )
        acc += part * sc.to(tl.float32)
    out = tl.sum(acc, axis=1)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, out, mask=n_mask)


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


def tma_launch(
    x: torch.Tensor, b: ExpertMatrix, out: torch.Tensor, ids: torch.Tensor, *,
    a_div: int, bn: int, bk: int, warps: int, split: int, stages: int,
) -> object:  # fmt: skip
    from triton.tools.tensor_descriptor import TensorDescriptor

    pairs = ids.numel()
    e, n, half = b.data.shape
    k = 2 * half
    flat = b.data.view(e * n, half)
    desc = TensorDescriptor.from_tensor(flat, [bn, bk // 2])
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    ng = bk // b.group_size if bk > b.group_size else 1
    grid = (pairs, triton.cdiv(n, bn), split)
    assert b.scale is not None
    return _gemv_tma[grid](
        x, desc, b.scale, out, ids, n, k, k_per,
        x.stride(0), b.scale.stride(0), b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=b.group_size, NG=ng, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages,
        num_warps=warps,
    )  # fmt: skip


def word_launch(
    x: torch.Tensor, b: ExpertMatrix, out: torch.Tensor, ids: torch.Tensor, *,
    a_div: int, bn: int, bk: int, warps: int, split: int, xmode: int,
) -> object:  # fmt: skip
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n = words.shape[1]
    k = 8 * words.shape[2]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    even = k % bk == 0 and k_per % bk == 0 and (k_per * split == k or k % k_per == 0)
    grid = (pairs, triton.cdiv(n, bn), split)
    assert b.scale is not None
    return _gemv_word[grid](
        x, words, b.scale, out, ids, n, k, k_per,
        x.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=b.group_size, BLOCK_N=bn, BLOCK_K=bk, EVEN=even, XMODE=xmode,
        num_warps=warps,
    )  # fmt: skip


def probe_launch(
    x: torch.Tensor, b: ExpertMatrix, out: torch.Tensor, ids: torch.Tensor, *,
    a_div: int, bn: int, bk: int, warps: int, split: int, mode: int,
) -> object:  # fmt: skip
    pairs = ids.numel()
    n, half = b.data.shape[1], b.data.shape[2]
    k = 2 * half
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    ng = bk // b.group_size if bk > b.group_size else 1
    grid = (pairs, triton.cdiv(n, bn), split)
    assert b.scale is not None
    return _gemv_probe[grid](
        x, b.data, b.scale, out, ids, n, k, k_per,
        x.stride(0), b.data.stride(0), b.data.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=b.group_size, NG=ng, BLOCK_N=bn, BLOCK_K=bk, MODE=mode,
        EVEN=k % bk == 0 and k_per % bk == 0, num_warps=warps,
    )  # fmt: skip
