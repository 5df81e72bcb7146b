"""Typed host wrappers of the fused-MoE kernels: check, allocate, launch.

May import core; triton only inside functions. Shape legend: ``T`` tokens, ``D``
hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k, ``N`` = T*K routed pairs,
``S`` K-splits of the w2 GEMM.
"""

import os
from typing import Literal

import attrs
import torch

from backends.triton._align import BlockAlignment, align_pairs_to_blocks
from backends.triton._configs import (
    GEMV,
    GEMV_BY_DEFAULT,
    GEMV_INTERPRETER,
    INTERPRETER,
    GemmTiles,
    MoETiles,
    choose_tiles,
    split_for,
)
from core.config import MoEConfig
from core.errors import DTypeError
from core.routing import Routing

_ACTIVATION_CODE = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "swigluoai": 3}


@attrs.frozen(kw_only=True, eq=False)
class ExpertMatrix:
    """One projection of every expert, as the B operand of a grouped GEMM.

    Attributes:
        data: uint8 ``(E, rows, cols/2)`` int4 codes (canonical layout) or 16-bit
            ``(E, rows, cols)`` weights.
        scale: ``(E, rows, cols/G)`` (int4 only).
        zero_point: uint8 ``(E, rows, cols/G)`` (asymmetric int4 only).
        group_size: effective group size ``G`` along ``cols`` (int4 only).
    """

    data: torch.Tensor
    scale: torch.Tensor | None = None
    zero_point: torch.Tensor | None = None
    group_size: int = 0

    @property
    def is_int4(self) -> bool:
        """Whether ``data`` holds packed int4 codes."""
        return self.data.dtype == torch.uint8


def is_interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _operand_dtype(dtype: torch.dtype) -> tuple[object, int]:
    """Dot operand dtype and its code (0 float32, 1 bfloat16, 2 float16)."""
    import triton.language as tl

    if is_interpreting():
        return tl.float32, 0  # the interpreter's bf16 math is wrong (triton#11584)
    if dtype == torch.bfloat16:
        return tl.bfloat16, 1
    return tl.float16, 2


def _dequant_mode(b: "ExpertMatrix", tiles: GemmTiles, k: int) -> int:
    """``tiles.dequant`` where it applies (0 for 16-bit weights).

    Mode 2 needs each K step inside one group: ``block_k`` divides the group size, or
    one group spans the row.
    """
    if not b.is_int4:
        return 0
    if tiles.dequant == 2 and not (
        b.group_size % tiles.block_k == 0 or b.group_size == k
    ):
        return 1
    return tiles.dequant


def _buffer_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the intermediate buffers: ``dtype``, float32 in the interpreter.

    The interpreter truncates float32 to bf16 on store instead of rounding, which
    doubles the error; there the buffers stay float32 and torch casts the output.
    """
    return torch.float32 if is_interpreting() else dtype


def _launch_gemm(
    a_MK: torch.Tensor,
    b: ExpertMatrix,
    out: torch.Tensor,
    align: BlockAlignment,
    tiles: GemmTiles,
    *,
    n: int,
    routing: Routing,
    config: MoEConfig,
    gated: bool,
) -> None:
    """Launch ``_moe_gemm_kernel`` writing ``out`` ``(S, N, n)`` or ``(N, n)``."""
    import triton

    from backends.triton._kernels import _moe_gemm_kernel

    k = int(a_MK.shape[1])
    k_per_split = (
        triton.cdiv(triton.cdiv(k, tiles.split_k), tiles.block_k) * tiles.block_k
    )
    scale = b.scale if b.scale is not None else b.data
    zero = b.zero_point if b.zero_point is not None else scale
    grid = (align.max_blocks, triton.cdiv(n, tiles.block_n), tiles.split_k)
    ct, ct_code = _operand_dtype(a_MK.dtype)
    _moe_gemm_kernel[grid](
        a_MK,
        b.data,
        scale,
        zero,
        out,
        align.sorted_pairs,
        align.block_expert,
        align.block_rows,
        routing.topk_weights,
        n,
        k,
        k_per_split,
        float(config.swiglu_alpha),
        float(config.swiglu_limit),
        a_MK.stride(0),
        b.data.stride(0),
        b.data.stride(1),
        scale.stride(0),
        scale.stride(1),
        out.stride(0) if out.ndim == 3 else 0,
        out.stride(-2),
        A_DIV=routing.top_k if gated else 1,
        GROUP=b.group_size if b.is_int4 else 1,
        INT4=b.is_int4,
        HAS_ZP=b.zero_point is not None,
        GATED=gated,
        ACT=_ACTIVATION_CODE[config.activation],
        WEIGHT_ROWS=gated and config.apply_router_weight_on_input,
        CT=ct,
        CT_CODE=ct_code,
        DEQ=_dequant_mode(b, tiles, k),
        BLOCK_M=align.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


GEMV_WORDS = True
"""Which GEMV kernel runs (benchmark switch): int32 words (True) or bytes."""


def _gemv_block_k(tiles: GemmTiles, group: int, k: int) -> int:
    """The words kernel's step: ``tiles.block_k`` halved until it divides the group.

    Any step works when one group spans the row.
    """
    if group == k:
        return tiles.block_k
    step = tiles.block_k
    while group % step:
        step //= 2
    return step


def _launch_gemv(
    a_MK: torch.Tensor,
    b: ExpertMatrix,
    out: torch.Tensor,
    *,
    n: int,
    routing: Routing,
    config: MoEConfig,
    gated: bool,
    tiles: GemmTiles | None = None,
) -> None:
    """Launch a GEMV kernel writing ``out`` ``(S, N, n)`` or ``(N, n)``."""
    import triton

    from backends.triton._kernels import _moe_gemv_kernel, _moe_gemv_words_kernel

    assert b.scale is not None
    k = int(a_MK.shape[1])
    if tiles is None:
        tiles = GEMV_INTERPRETER if is_interpreting() else GEMV
    group = b.group_size
    zero = b.zero_point if b.zero_point is not None else b.scale
    split = int(out.shape[0]) if out.ndim == 3 else 1
    common = {
        "A_DIV": routing.top_k if gated else 1,
        "GROUP": group,
        "HAS_ZP": b.zero_point is not None,
        "GATED": gated,
        "ACT": _ACTIVATION_CODE[config.activation],
        "WEIGHT_ROWS": gated and config.apply_router_weight_on_input,
        "BLOCK_N": tiles.block_n,
        "num_warps": tiles.num_warps,
        "num_stages": tiles.num_stages,
    }
    if GEMV_WORDS:
        block_k = _gemv_block_k(tiles, group, k)
        k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
        words = b.data.view(torch.int32)
        grid = (routing.topk_ids.numel(), triton.cdiv(n, tiles.block_n), split)
        _moe_gemv_words_kernel[grid](
            a_MK, words, b.scale, zero, out, routing.topk_ids, routing.topk_weights,
            n, k, k_per_split, float(config.swiglu_alpha), float(config.swiglu_limit),
            a_MK.stride(0), words.stride(0), words.stride(1), b.scale.stride(0),
            b.scale.stride(1), out.stride(0) if out.ndim == 3 else 0, out.stride(-2),
            BLOCK_K=block_k, **common,
        )  # fmt: skip
        return
    assert split == 1
    ng = (
        tiles.block_k // group
        if group < tiles.block_k and tiles.block_k % group == 0
        else 1
    )
    grid2 = (routing.topk_ids.numel(), triton.cdiv(n, tiles.block_n))
    _moe_gemv_kernel[grid2](
        a_MK, b.data, b.scale, zero, out, routing.topk_ids, routing.topk_weights,
        n, k, float(config.swiglu_alpha), float(config.swiglu_limit),
        a_MK.stride(0), b.data.stride(0), b.data.stride(1), b.scale.stride(0),
        b.scale.stride(1), out.stride(-2),
        NG=ng, BLOCK_K=tiles.block_k, **common,
    )  # fmt: skip


def use_gemv(
    num_pairs: int, w13: ExpertMatrix, *, enabled: bool = GEMV_BY_DEFAULT
) -> bool:
    """Decode rule: int4 weights and at most one routed pair per two experts.

    Then pairs rarely share an expert, so the pair-major GEMV reads each used
    expert's bytes about once, without the GEMM's 16-row minimum or its alignment.
    ``enabled`` defaults to ``GEMV_BY_DEFAULT``. Also needs both reduction sizes to be
    multiples of 8 (whole int32 words of codes).
    """
    if not (enabled and w13.is_int4 and 2 * num_pairs <= int(w13.data.shape[0])):
        return False
    return gemv_fits(w13)


def gemv_fits(b: ExpertMatrix) -> bool:
    """Whether the words GEMV can read ``b``: int4, rows of whole int32 words."""
    return (
        b.is_int4
        and int(b.data.shape[2]) % 4 == 0
        and b.data.stride(2) == 1
        and b.data.stride(1) % 4 == 0
        and b.data.stride(0) % 4 == 0
        and b.data.storage_offset() % 4 == 0
    )


def _reduce_topk(
    part_SND: torch.Tensor, routing: Routing, *, weighted: bool, dtype: torch.dtype
) -> torch.Tensor:
    """``(T, D)``: sum of the K-split partials and the top-k pairs of each token."""
    import triton

    from backends.triton._kernels import _reduce_topk_kernel

    t, top_k = routing.topk_ids.shape
    d = int(part_SND.shape[2])
    out_TD = torch.empty(t, d, dtype=_buffer_dtype(dtype), device=part_SND.device)
    block_d = min(1024, triton.next_power_of_2(d))
    _reduce_topk_kernel[(t, triton.cdiv(d, block_d))](
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
    )
    return out_TD.to(dtype)


def pick_tiles(num_pairs: int, w13: ExpertMatrix, w2: ExpertMatrix) -> MoETiles:
    """The tile table's entry for these sizes (small tiles in the interpreter)."""
    if is_interpreting():
        return INTERPRETER
    return choose_tiles(
        num_pairs=num_pairs,
        num_experts=int(w13.data.shape[0]),
        hidden_size=int(w2.data.shape[1]),
        intermediate_size=int(w13.data.shape[1]) // 2,
    )


def _gemv_moe(
    x_TD: torch.Tensor,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    routing: Routing,
    config: MoEConfig,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """The decode path: two pair-major int4 GEMVs and the top-k sum (three launches)."""
    if not w13.is_int4 or not w2.is_int4:
        raise DTypeError("the gemv path needs int4 (uint8) weights, got 16-bit weights")
    if GEMV_WORDS and not (gemv_fits(w13) and gemv_fits(w2)):
        raise DTypeError(
            "the gemv path needs rows of whole int32 words of codes (hidden and "
            "intermediate sizes multiples of 8, contiguous rows)"
        )
    num_pairs, d = routing.topk_ids.numel(), int(x_TD.shape[1])
    f = int(w13.data.shape[1]) // 2
    if tiles is None:
        tiles = GEMV_INTERPRETER if is_interpreting() else GEMV
    buffer_dtype = _buffer_dtype(x_TD.dtype)
    inter_NF = torch.empty(num_pairs, f, dtype=buffer_dtype, device=x_TD.device)
    _launch_gemv(
        x_TD, w13, inter_NF, n=f, routing=routing, config=config, gated=True,
        tiles=tiles,
    )  # fmt: skip
    split = 1
    if GEMV_WORDS:
        out_tiles = num_pairs * -(-d // tiles.block_n)
        split = min(tiles.split_k, split_for(out_tiles, f, tiles.block_k))
    part_dtype = torch.float32 if split > 1 else buffer_dtype
    part_SND = torch.empty(split, num_pairs, d, dtype=part_dtype, device=x_TD.device)
    _launch_gemv(
        inter_NF, w2, part_SND, n=d, routing=routing, config=config, gated=False,
        tiles=tiles,
    )  # fmt: skip
    weighted = not config.apply_router_weight_on_input
    return _reduce_topk(part_SND, routing, weighted=weighted, dtype=x_TD.dtype)


def fused_moe(
    hidden_TD: torch.Tensor,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    routing: Routing,
    config: MoEConfig,
    *,
    tiles: MoETiles | None = None,
    path: Literal["auto", "gemm", "gemv"] = "auto",
    gemv_tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """The MoE layer: align, w13 GEMM + activation, w2 GEMM, weighted top-k sum.

    Args:
        hidden_TD: ``(T, D)`` bf16 or fp16 activations.
        w13: gate and up rows ``(E, 2F, D)`` (packed or 16-bit).
        w2: down rows ``(E, D, F)`` (packed or 16-bit).
        routing: ``(T, K)`` float32 weights and ids (``-1`` contributes zero).
        config: activation and ``apply_router_weight_on_input``.
        tiles: tile override (benchmark sweeps); default from the tile table.
        path: `gemv` (int4 decode kernel), `gemm` (grouped GEMM) or `auto` (``use_gemv``).
        gemv_tiles: GEMV tile override (benchmark sweeps); ``split_k`` caps the w2 split.

    Returns:
        ``(T, D)`` in the dtype of ``hidden_TD``.
    """
    if hidden_TD.dtype not in (torch.bfloat16, torch.float16):
        raise DTypeError(
            f"hidden_states must be bfloat16 or float16, got {hidden_TD.dtype}"
        )
    t, d = hidden_TD.shape
    if t == 0:
        return hidden_TD.new_empty((0, d))
    routing = Routing(
        topk_weights=routing.topk_weights.float().contiguous(),
        topk_ids=routing.topk_ids.contiguous(),
    )
    num_pairs = routing.topk_ids.numel()
    f = int(w13.data.shape[1]) // 2
    if path == "gemv" or (
        path == "auto" and tiles is None and use_gemv(num_pairs, w13)
    ):
        return _gemv_moe(
            hidden_TD.contiguous(), w13, w2, routing, config, gemv_tiles
        )
    chosen = tiles if tiles is not None else pick_tiles(num_pairs, w13, w2)
    align = align_pairs_to_blocks(
        routing.topk_ids, int(w13.data.shape[0]), block_m=chosen.block_m
    )
    buffer_dtype = _buffer_dtype(hidden_TD.dtype)
    inter_NF = torch.empty(num_pairs, f, dtype=buffer_dtype, device=hidden_TD.device)
    x_TD = hidden_TD.contiguous()
    _launch_gemm(
        x_TD,
        w13,
        inter_NF,
        align,
        chosen.w13,
        n=f,
        routing=routing,
        config=config,
        gated=True,
    )
    split = chosen.w2.split_k
    part_dtype = torch.float32 if split > 1 else buffer_dtype
    part_SND = torch.empty(
        split, num_pairs, d, dtype=part_dtype, device=hidden_TD.device
    )
    _launch_gemm(
        inter_NF,
        w2,
        part_SND,
        align,
        chosen.w2,
        n=d,
        routing=routing,
        config=config,
        gated=False,
    )
    weighted = not config.apply_router_weight_on_input
    return _reduce_topk(part_SND, routing, weighted=weighted, dtype=hidden_TD.dtype)
