"""Typed host wrapper of the decode GEMV kernels (``launch_gemv``) and its TMA rules.

The pair-major GEMVs of ``_kernels_gemv.py`` (bytes, 16-bit), ``_kernels_gemv_words.py``
and ``_kernels_gemv_pairs.py`` (int32 words). May import core; triton only inside
functions. Shape legend as in ``_launch.py``.
"""

import torch

from backends.triton._configs import ceil_div
from backends.triton._launch import (
    ACTIVATION_CODE,
    ExpertMatrix,
    int4_words_fit,
    pdl_launch_options,
    pdl_target,
    ptx_target,
    tma_target,
)
from backends.triton._tiles import GemvTiles
from core.config import MoEConfig
from core.routing import Routing


def tma_fit(b: ExpertMatrix, tiles: GemvTiles) -> bool:
    """Whether the paired GEMV can read ``b``'s words by TMA with ``tiles``.

    Needs ``int4_words_fit`` with groups of two words or more (the paired kernel),
    steps within one group or over whole power-of-two groups (a step's tile splits
    into the groups' halves in registers), contiguous words, and
    ``_words_descriptor``'s descriptor: rows of 16-byte
    multiples (``K % 32 == 0``), a 16-byte aligned base, and a box of powers of two,
    at most 256 per dimension (``block_n`` rows, ``block_k / 8`` words).
    """
    if not int4_words_fit(b) or b.group_size < 16:
        return False
    words = b.data.view(torch.int32)
    e, rows, kw = (int(n) for n in words.shape)
    box = (tiles.block_n, tiles.block_k // 8)
    group = b.group_size
    return (
        words.is_contiguous()
        and (tiles.block_k <= group or group & (group - 1) == 0)  # whole halves
        and kw % 4 == 0
        and words.data_ptr() % 16 == 0
        and all(0 < n <= 256 and n & (n - 1) == 0 for n in box)
        and e * rows < 2**31
    )


def _words_descriptor(words: torch.Tensor, tiles: GemvTiles) -> object:
    """``_tma_words``' descriptor: ``words`` as ``[E * R, K / 8]``.

    Blocks of ``[block_n, block_k / 8]`` words.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    e, rows, kw = (int(n) for n in words.shape)
    view = words.view(e * rows, kw)
    return TensorDescriptor.from_tensor(view, [tiles.block_n, tiles.block_k // 8])


def _tma_descriptor(
    b: ExpertMatrix, words: torch.Tensor, tiles: GemvTiles
) -> object | None:
    """``_words_descriptor`` of ``b``'s ``words``, ``None`` where ``tma_fit`` refuses.

    Both depend only on the matrix and the block (about 7 us a launch together), so
    ``b`` keeps the answer per block (``ExpertMatrix.descriptors``).
    """
    block = (tiles.block_n, tiles.block_k)
    if block not in b.descriptors:
        fit = tma_fit(b, tiles)
        b.descriptors[block] = _words_descriptor(words, tiles) if fit else None
    return b.descriptors[block]


def gemv_loop_stages(tiles: GemvTiles, *, tma: bool) -> int | None:
    """The K loop's ``num_stages``: ``tiles.loop_stages``, but None (unpipelined).

    That is for TMA tiles that fall back to plain loads (``tma`` False): their depth
    is TMA's, and Triton's pipelining of plain loads measured slower
    (bench/TUNING.md).
    """
    return None if tiles.tma and not tma else tiles.loop_stages


def launch_gemv(
    a_MK: torch.Tensor,
    b: ExpertMatrix,
    out: torch.Tensor,
    *,
    n: int,
    routing: Routing,
    config: MoEConfig,
    gated: bool,
    tiles: GemvTiles,
    split: int = 1,
) -> None:
    """Launch the decode GEMV writing ``out`` ``(N, n)``.

    With ``split`` > 1 (ungated only) ``out`` is ``(split, N, n)`` float32 partials.
    16-bit weights: ``_moe_gemv16_kernel``. int4: with ``tiles.words`` and
    ``int4_words_fit`` ``_moe_gemv_pairs_kernel`` (``tiles.paired``, groups of two
    words or more) or ``_moe_gemv_words_kernel``, else the byte kernel
    ``_moe_gemv_kernel``.
    """
    assert split == 1 or (not gated and out.ndim == 3 and out.shape[0] == split)
    k = int(a_MK.shape[1])
    k_per_split = ceil_div(ceil_div(k, split), tiles.block_k) * tiles.block_k
    bias = b.bias if b.bias is not None else b.data
    grid = (routing.topk_ids.numel(), ceil_div(n, tiles.block_n), split)
    common = (
        routing.topk_ids,
        routing.topk_weights,
        bias,
        n,
        k,
        k_per_split,
        float(config.swiglu_alpha),
        float(config.swiglu_limit),
        a_MK.stride(0),
    )
    out_strides = (
        out.stride(0) if out.ndim == 3 else 0,
        out.stride(-2),
        bias.stride(0),
    )
    meta = _gemv_meta(tiles, routing=routing, config=config, gated=gated, bias=b.bias)
    if not b.is_int4:
        from backends.triton._kernels_gemv import _moe_gemv16_kernel

        _moe_gemv16_kernel[grid](
            a_MK, b.data, out, *common, b.data.stride(0), b.data.stride(1),
            *out_strides, **meta,
        )  # fmt: skip
        return
    meta |= {"GROUP": b.group_size, "HAS_ZP": b.zero_point is not None}
    if tiles.words and int4_words_fit(b):
        _launch_words(
            a_MK, b, out, grid=grid, common=common, out_strides=out_strides,
            meta=meta, tiles=tiles, gated=gated,
        )  # fmt: skip
        return
    from backends.triton._kernels_gemv import _moe_gemv_kernel

    assert b.scale is not None
    zero = b.zero_point if b.zero_point is not None else b.scale
    group = b.group_size
    ng = (
        tiles.block_k // group
        if group < tiles.block_k and tiles.block_k % group == 0
        else 1
    )
    _moe_gemv_kernel[grid](
        a_MK, b.data, b.scale, zero, out, *common,
        b.data.stride(0), b.data.stride(1), b.scale.stride(0), b.scale.stride(1),
        *out_strides, NG=ng, PREFETCH=tiles.prefetch,
        LOOP_STAGES=gemv_loop_stages(tiles, tma=False), **meta,
    )  # fmt: skip


def _launch_words(
    a_MK: torch.Tensor,
    b: ExpertMatrix,
    out: torch.Tensor,
    *,
    grid: tuple[int, int, int],
    common: tuple[object, ...],
    out_strides: tuple[int, int, int],
    meta: dict[str, object],
    tiles: GemvTiles,
    gated: bool,
) -> None:
    """``launch_gemv``'s int32-word kernels, paired or one word a float16 chain.

    Paired where ``tiles.paired`` and groups hold two words or more, by TMA where
    ``tiles.tma``, ``tma_target`` and ``tma_fit`` allow, its products in integers
    where ``tiles.int_dot`` (the one-word kernel has no integer form), its inputs a
    step ahead where ``tiles.inputs_ahead`` (the one-word kernel ignores it). ``common``,
    ``out_strides`` and ``meta`` as ``launch_gemv`` built them.
    """
    from backends.triton._kernels_gemv_pairs import _moe_gemv_pairs_kernel
    from backends.triton._kernels_gemv_words import _moe_gemv_words_kernel

    assert b.scale is not None
    k = int(a_MK.shape[1])
    zero = b.zero_point if b.zero_point is not None else b.scale
    words = b.data.view(torch.int32)
    pdl = tiles.pdl and pdl_target(a_MK)
    paired = tiles.paired and b.group_size >= 16  # two words a group
    tma_ok = paired and tiles.tma and tma_target(a_MK)
    desc = _tma_descriptor(b, words, tiles) if tma_ok else None
    tma = desc is not None
    launch = {
        "EVEN": k % tiles.block_k == 0, "PREFETCH": tiles.prefetch,
        "LOOP_STAGES": gemv_loop_stages(tiles, tma=tma), "ASM": ptx_target(a_MK),
        "PDL_WAIT": pdl and not gated, "PDL_NEXT": pdl,
    } | meta | pdl_launch_options(on=pdl and not gated)  # fmt: skip
    head = (a_MK, words, b.scale, zero, out, *common[:3])
    tail = (
        *common[3:], words.stride(0), words.stride(1), b.scale.stride(0),
        b.scale.stride(1), *out_strides,
    )  # fmt: skip
    if not paired:
        _moe_gemv_words_kernel[grid](*head, *tail, **launch)
        return
    _moe_gemv_pairs_kernel[grid](
        *head, desc, *tail, TMA=tma, INT_DOT=tiles.int_dot,
        X_AHEAD=tiles.inputs_ahead, **launch,
    )  # fmt: skip


def _gemv_meta(
    tiles: GemvTiles,
    *,
    routing: Routing,
    config: MoEConfig,
    gated: bool,
    bias: torch.Tensor | None,
) -> dict[str, object]:
    """The meta-parameters every GEMV kernel takes (int4 ones add GROUP and HAS_ZP)."""
    return {
        "A_DIV": routing.top_k if gated else 1,
        "GATED": gated,
        "ACT": ACTIVATION_CODE[config.activation],
        "WEIGHT_ROWS": gated and config.apply_router_weight_on_input,
        "HAS_BIAS": bias is not None,
        "BLOCK_N": tiles.block_n,
        "BLOCK_K": tiles.block_k,
        "num_warps": tiles.num_warps,
    }
