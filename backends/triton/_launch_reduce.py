"""Typed host wrappers of the summing launches: split partials' activation, top-k sum.

May import core; triton only inside functions (``_launch.py`` has the others).
"""

import torch

from backends.triton._configs import ceil_div, next_pow2
from backends.triton._launch import (
    ACTIVATION_CODE,
    buffer_dtype,
    pdl_launch_options,
    pdl_target,
)
from core.config import MoEConfig
from core.routing import Routing


def reduce_topk(
    part_SND: torch.Tensor,
    routing: Routing,
    *,
    weighted: bool,
    dtype: torch.dtype,
    pdl: bool = False,
) -> torch.Tensor:
    """``(T, D)``: sum of the K-split partials and the top-k pairs of each token.

    ``pdl``: launched with programmatic dependent launch (where ``pdl_target``),
    waiting for the kernel before it on the GPU (``GemvTiles.pdl``,
    ``MoETiles.pdl``).
    """
    from backends.triton._kernels import _reduce_topk_kernel

    t, top_k = routing.topk_ids.shape
    d = int(part_SND.shape[2])
    pdl = pdl and pdl_target(part_SND)
    buffer = buffer_dtype(dtype)
    out_TD = torch.empty(t, d, dtype=buffer, device=part_SND.device)
    block_d = min(1024, next_pow2(d))
    _reduce_topk_kernel[(t, ceil_div(d, block_d))](
        part_SND,
        routing.topk_ids,
        routing.topk_weights,
        out_TD,
        d,
        part_SND.stride(0),
        part_SND.stride(1),
        out_TD.stride(0),
        TOP_K=top_k,
        SPLIT=int(part_SND.shape[0]),
        WEIGHTED=weighted,
        BLOCK_D=block_d,
        PDL=pdl,
        **pdl_launch_options(on=pdl),
    )
    return out_TD if buffer == dtype else out_TD.to(dtype)  # a no-op ``to``: ~1 us


def launch_activate(
    part_SNF2: torch.Tensor,
    routing: Routing,
    config: MoEConfig,
    out_NF: torch.Tensor,
    *,
    experts: tuple[int, int],
    pdl: bool = False,
) -> None:
    """``out_NF = act(gate) * up`` of a K-split w13 GEMM's partials ``(S, N, 2F)``.

    Only the rows of pairs routed to ``experts`` ``(lo, hi)`` (the GEMM's) are read
    and written (``_activate_splits_kernel``). ``pdl`` (``MoETiles.pdl``): launched
    with programmatic dependent launch where ``pdl_target`` holds.
    """
    from backends.triton._kernels import _activate_splits_kernel

    num_pairs, f = int(out_NF.shape[0]), int(out_NF.shape[1])
    block_f = min(1024, next_pow2(f))
    pdl = pdl and pdl_target(out_NF)
    _activate_splits_kernel[(num_pairs, ceil_div(f, block_f))](
        part_SNF2,
        routing.topk_ids,
        out_NF,
        f,
        float(config.swiglu_alpha),
        float(config.swiglu_limit),
        experts[0],
        experts[1],
        part_SNF2.stride(0),
        part_SNF2.stride(1),
        out_NF.stride(0),
        ACT=ACTIVATION_CODE[config.activation],
        SPLIT=int(part_SNF2.shape[0]),
        BLOCK_F=block_f,
        PDL=pdl,
        **pdl_launch_options(on=pdl),
    )
