"""Typed host wrapper of the one-launch decode GEMV (``GemvTiles.handoff``).

``_moe_gemv_handoff_kernel`` (``_kernels_gemv_handoff.py``) runs the paired w13 and w2
GEMVs of ``launch_gemv`` in one launch, each pair's w2 after its w13. May import core;
triton only inside functions. Shape legend as in ``_launch.py``.
"""

import torch

from backends.triton._configs import ceil_div
from backends.triton._launch import (
    ACTIVATION_CODE,
    ExpertMatrix,
    int4_words_fit,
    pdl_target,
    ptx_target,
    tma_target,
)
from backends.triton._launch_gemv import _tma_descriptor, gemv_loop_stages
from backends.triton._tiles import GemvTiles
from core.config import MoEConfig
from core.routing import Routing

LINE_BYTES = 128
"""The intermediate's rows start on lines of this many bytes (``handoff_rows``)."""


def handoff_fits(w13: ExpertMatrix, w2: ExpertMatrix, tiles: GemvTiles) -> bool:
    """Whether ``tiles`` run both GEMVs in one launch on these weights.

    ``tiles.handoff``; the paired word kernel on both (``words`` and ``paired`` on
    ``tiles`` and on the w2 tiles, ``int4_words_fit``, groups of two words or more);
    the same warps on both.
    """
    tiles2 = tiles.w2_tiles or tiles
    return (
        tiles.handoff
        and all(t.words and t.paired for t in (tiles, tiles2))
        and tiles.num_warps == tiles2.num_warps
        and all(int4_words_fit(b) and b.group_size >= 16 for b in (w13, w2))
    )


def handoff_rows(num_pairs: int, f: int, like: torch.Tensor) -> torch.Tensor:
    """The intermediate ``(N, F)`` in ``like``'s dtype and device, rows line-aligned.

    Each row on its own 128-byte lines (row stride rounded up), so a w2 job never
    reads a line of a row that another pair's w13 jobs are still writing.
    """
    per_line = LINE_BYTES // like.element_size()
    stride = ceil_div(f, per_line) * per_line
    full = torch.empty(num_pairs, stride, dtype=like.dtype, device=like.device)
    return full[:, :f]


def launch_gemv_handoff(
    x_TD: torch.Tensor,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    buffers: tuple[torch.Tensor, torch.Tensor],
    *,
    routing: Routing,
    config: MoEConfig,
    tiles: GemvTiles,
) -> None:
    """Both GEMVs in one launch into ``buffers``: ``(inter_NF, part_SND)``.

    ``inter_NF`` from ``handoff_rows``; ``part_SND`` ``(S, N, D)``: w2's K-split
    partials, float32 where S > 1. Where ``handoff_fits``. TMA, integer products, steps ahead and pipelining as
    ``launch_gemv`` gives each GEMV on ``tiles`` and its w2 tiles; programmatic
    dependent launch lets the top-k sum after it start early (``tiles.pdl``).
    """
    from backends.triton._kernels_gemv_handoff import _moe_gemv_handoff_kernel

    inter_NF, part_SND = buffers
    tiles2 = tiles.w2_tiles or tiles
    assert w13.scale is not None
    assert w2.scale is not None
    num_pairs, d = routing.topk_ids.numel(), int(x_TD.shape[1])
    f, split = int(inter_NF.shape[1]), int(part_SND.shape[0])
    words13, words2 = w13.data.view(torch.int32), w2.data.view(torch.int32)
    tma = tma_target(x_TD)
    desc13 = _tma_descriptor(w13, words13, tiles) if tiles.tma and tma else None
    desc2 = _tma_descriptor(w2, words2, tiles2) if tiles2.tma and tma else None
    bias13 = w13.bias if w13.bias is not None else w13.scale
    bias2 = w2.bias if w2.bias is not None else w2.scale
    zero13 = w13.zero_point if w13.zero_point is not None else w13.scale
    zero2 = w2.zero_point if w2.zero_point is not None else w2.scale
    count = torch.zeros(1 + num_pairs, dtype=torch.int32, device=x_TD.device)
    jobs = ceil_div(f, tiles.block_n) + ceil_div(d, tiles2.block_n) * split
    _moe_gemv_handoff_kernel[(num_pairs * jobs,)](
        x_TD, words13, w13.scale, zero13, inter_NF, words2, w2.scale, zero2,
        part_SND, routing.topk_ids,
        routing.topk_weights, bias13, bias2, desc13, desc2, count, num_pairs, d, f,
        ceil_div(ceil_div(f, split), tiles2.block_k) * tiles2.block_k,
        float(config.swiglu_alpha), float(config.swiglu_limit), x_TD.stride(0),
        words13.stride(0), words13.stride(1), w13.scale.stride(0),
        w13.scale.stride(1), inter_NF.stride(0), words2.stride(0), words2.stride(1),
        w2.scale.stride(0), w2.scale.stride(1), part_SND.stride(0),
        part_SND.stride(1), bias13.stride(0), bias2.stride(0),
        A_DIV=routing.top_k, GROUP13=w13.group_size, GROUP2=w2.group_size,
        HAS_ZP=w13.zero_point is not None,
        ACT=ACTIVATION_CODE[config.activation],
        WEIGHT_ROWS=config.apply_router_weight_on_input,
        HAS_BIAS13=w13.bias is not None, HAS_BIAS2=w2.bias is not None,
        BLOCK_N13=tiles.block_n, BLOCK_N2=tiles2.block_n, BLOCK_K13=tiles.block_k,
        BLOCK_K2=tiles2.block_k, SPLIT2=split, EVEN13=d % tiles.block_k == 0,
        EVEN2=f % tiles2.block_k == 0, PREFETCH13=tiles.prefetch,
        PREFETCH2=tiles2.prefetch,
        STAGES13=gemv_loop_stages(tiles, tma=desc13 is not None),
        STAGES2=gemv_loop_stages(tiles2, tma=desc2 is not None), ASM=ptx_target(x_TD),
        TMA13=desc13 is not None, TMA2=desc2 is not None, INT_DOT13=tiles.int_dot,
        INT_DOT2=tiles2.int_dot, PDL_NEXT=tiles.pdl and pdl_target(x_TD),
        num_warps=tiles.num_warps,
    )  # fmt: skip
