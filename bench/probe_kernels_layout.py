"""Decode GEMV probe: does a tile-contiguous weight layout feed the word GEMV faster?

``_gemv_layout`` is the library's word GEMV math (``_word_dot`` with the half2 asm,
``_step_scale``) on one non-gated matrix, reading its words either row-major
(``[E, N, K/8]``, the canonical layout: each step reads ``BLOCK_N`` runs of
``BLOCK_K / 2`` bytes, ``K / 2`` bytes apart) or tile-blocked (``[E, N/BN, K/BK, BN,
BK/8]``: each step reads one contiguous ``BN * BK / 2``-byte tile, and a program's
whole share of the matrix is one contiguous run). ``MODE`` 9 sums the words only
(the memory side alone), 8 likewise with two steps' loads in flight. Needs ``N % BLOCK_N == 0`` and ``K % BLOCK_K == 0``.
"""

# ruff: noqa: D103, TID253
# Launchers take the probe's keyword arguments (probe_gemv.py's variant tables).

import os

import torch
import triton
import triton.language as tl

from backends.triton._kernels_gemv_words import _step_scale, _word_dot, _x_plane
from backends.triton._launch import ExpertMatrix


@triton.jit
def _read_two_steps(
    tile, bits, k_lo, k_hi, kw,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCKED: tl.constexpr,
):  # fmt: skip
    """``MODE`` 8: the tile's words only, two steps' loads in flight an iteration."""
    BW: tl.constexpr = BLOCK_K // 8
    offs_r = tl.arange(0, BLOCK_N)
    offs_i = tl.arange(0, BW)
    for k0 in range(k_lo, k_hi, 2 * BLOCK_K):
        if BLOCKED:
            ptrs = tile + (k0 // BLOCK_K) * (BLOCK_N * BW) + offs_r[:, None] * BW
            w0 = tl.load(ptrs + offs_i[None, :])
            w1 = tl.load(ptrs + BLOCK_N * BW + offs_i[None, :])
        else:
            ptrs = tile + offs_r[:, None] * kw + k0 // 8 + offs_i[None, :]
            w0 = tl.load(ptrs)
            w1 = tl.load(ptrs + BW)
        bits ^= w0 ^ w1
    return bits


@triton.jit
def _gemv_layout(
    a_ptr, w_ptr, s_ptr, c_ptr, ids_ptr, N, K, k_per_split,
    stride_am, stride_we, stride_se, stride_sn, stride_cs, stride_cm,
    A_DIV, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCKED: tl.constexpr, MODE: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if e < 0:
        return
    BW: tl.constexpr = BLOCK_K // 8
    WG: tl.constexpr = GROUP // 8
    nb = tl.program_id(1)
    offs_r = tl.arange(0, BLOCK_N)
    offs_n = nb * BLOCK_N + offs_r
    rows = offs_n.to(tl.int64)[:, None]
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_ptr = a_ptr + (p // A_DIV).to(tl.int64) * stride_am
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = s_ptr + e.to(tl.int64) * stride_se
    kw = K // 8
    tile = w_e + nb.to(tl.int64) * BLOCK_N * kw
    offs_i = tl.arange(0, BW)
    acc = tl.zeros([BLOCK_N, BW], dtype=tl.float32)
    bits = tl.zeros([BLOCK_N, BW], dtype=tl.int32)
    if MODE == 8:  # words only, two steps' loads in flight per iteration
        bits = _read_two_steps(tile, bits, k_lo, k_hi, kw, BLOCK_N, BLOCK_K, BLOCKED)
    for k0 in range(k_lo, k_hi if MODE != 8 else k_lo, BLOCK_K):
        wi = k0 // 8 + offs_i
        if BLOCKED:
            ptrs = tile + (k0 // BLOCK_K) * (BLOCK_N * BW) + offs_r[:, None] * BW
            words = tl.load(ptrs + offs_i[None, :])
        else:
            words = tl.load(tile + offs_r[:, None] * kw + wi[None, :])
        if MODE == 9:
            bits ^= words
        else:
            i_mask = offs_i < BW
            c0 = _x_plane(x_ptr, wi, i_mask, 0)
            c1 = _x_plane(x_ptr, wi, i_mask, 1)
            c2 = _x_plane(x_ptr, wi, i_mask, 2)
            c3 = _x_plane(x_ptr, wi, i_mask, 3)
            c4 = _x_plane(x_ptr, wi, i_mask, 4)
            c5 = _x_plane(x_ptr, wi, i_mask, 5)
            c6 = _x_plane(x_ptr, wi, i_mask, 6)
            c7 = _x_plane(x_ptr, wi, i_mask, 7)
            pw, inv = _step_scale(c0, c1, c2, c3, c4, c5, c6, c7)
            s = tl.load(s_e + rows * stride_sn + (wi // WG)[None, :]).to(tl.float32)
            t = _word_dot(
                words, tl.full([1, 1], 8.0, tl.float32), c0 * inv, c1 * inv,
                c2 * inv, c3 * inv, c4 * inv, c5 * inv, c6 * inv, c7 * inv, ASM,
            )  # fmt: skip
            acc += t * (s * pw)
    if MODE >= 8:
        acc += bits.to(tl.float32)
    c_ptrs = c_ptr + tl.program_id(2) * stride_cs + p.to(tl.int64) * stride_cm + offs_n
    tl.store(c_ptrs, tl.sum(acc, axis=1))


INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_BLOCKED: dict[tuple[int, int, int], torch.Tensor] = {}


def blocked_words(words: torch.Tensor, bn: int, bw: int) -> torch.Tensor:
    """``[E, N, KW]`` int32 -> ``[E, N/bn, KW/bw, bn, bw]`` contiguous (cached)."""
    key = (words.data_ptr(), bn, bw)
    if key not in _BLOCKED:
        _BLOCKED.clear()
        if words.is_cuda:
            torch.cuda.empty_cache()
        e, n, kw = words.shape
        _BLOCKED[key] = (
            words.view(e, n // bn, bn, kw // bw, bw).permute(0, 1, 3, 2, 4).contiguous()
        )
    return _BLOCKED[key]


def layout_launch(
    x: torch.Tensor, b: ExpertMatrix, out: torch.Tensor, ids: torch.Tensor, *,
    a_div: int, bn: int, bk: int, warps: int, split: int, blocked: int, mode: int,
) -> object:  # fmt: skip
    pairs = ids.numel()
    words = b.data.view(torch.int32)
    n, kw = words.shape[1], words.shape[2]
    k = 8 * kw
    assert n % bn == 0, (n, bn)
    assert k % (bk * split) == 0, (k, bk, split)
    w = blocked_words(words, bn, bk // 8) if blocked else words
    grid = (pairs, n // bn, split)
    assert b.scale is not None
    return _gemv_layout[grid](
        x, w, b.scale, out, ids, n, k, k // split,
        x.stride(0), n * kw, b.scale.stride(0), b.scale.stride(1),
        out.stride(0), out.stride(1),
        A_DIV=a_div, GROUP=b.group_size, BLOCK_N=bn, BLOCK_K=bk, BLOCKED=blocked,
        MODE=mode, ASM=x.is_cuda and not INTERPRET, num_warps=warps,
    )  # fmt: skip
