"""Assemble per-expert (or fused 3-D) int4 projections into QuantizedExpertWeights.

``w13`` is gate rows then up rows; ``w2`` is the down projection. Pure; imports only
torch, attrs and core. Shape legend: ``E`` experts, ``F`` intermediate, ``D`` hidden,
``N`` out rows, ``G`` groups.
"""

from collections.abc import Sequence

import torch

from core.errors import ConfigError, DTypeError, ShapeError
from core.formats.projection import Int4Projection
from core.scheme import SUPPORTED_GROUP_SIZES, Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights

_IMPLICIT_ZERO = 8


def stack_projections(
    name: str, projections: Sequence[Int4Projection]
) -> Int4Projection:
    """Stack per-expert 2-D projections into one ``(E, N, ...)`` projection.

    Raises:
        ShapeError: when the experts differ in shape or group size (named by index).
        DTypeError: when they differ in scale dtype.
    """
    if not projections:
        raise ShapeError(f"{name}: need at least one expert, got none")
    first = projections[0]
    for e, p in enumerate(projections):
        if p.qdata.ndim != 2 or p.qdata.shape != first.qdata.shape:
            raise ShapeError(
                f"{name}: expert {e} has packed shape {tuple(p.qdata.shape)}, expected "
                f"2-D {tuple(first.qdata.shape)} like expert 0"
            )
        if p.group_size != first.group_size:
            raise ShapeError(
                f"{name}: expert {e} has group_size={p.group_size}, expected "
                f"{first.group_size} like expert 0"
            )
        if p.scale.dtype != first.scale.dtype:
            raise DTypeError(
                f"{name}: expert {e} has scale dtype {p.scale.dtype}, expected "
                f"{first.scale.dtype} like expert 0"
            )
    zeros = _zeros_or_none(
        [p.zero_point for p in projections], [p.scale for p in projections]
    )
    return Int4Projection(
        qdata=torch.stack([p.qdata for p in projections]),
        scale=torch.stack([p.scale for p in projections]),
        zero_point=None if zeros is None else torch.stack(zeros),
        group_size=first.group_size,
    )


def _zeros_or_none(
    zeros: Sequence[torch.Tensor | None], scales: Sequence[torch.Tensor]
) -> list[torch.Tensor] | None:
    """All ``None`` stays ``None``; a mix gets the implicit 8 filled in (exact)."""
    if all(z is None for z in zeros):
        return None
    return [
        torch.full(s.shape, _IMPLICIT_ZERO, dtype=torch.uint8, device=s.device)
        if z is None
        else z
        for z, s in zip(zeros, scales, strict=True)
    ]


def concat_rows(
    name: str, first: Int4Projection, second: Int4Projection
) -> Int4Projection:
    """Concatenate two projections along the output rows (gate then up).

    Raises:
        ShapeError: when the leading dims, input dims, output rows (gate and up each
            hold ``F``) or group sizes differ.
        DTypeError: when the scale dtypes differ.
    """
    if first.qdata.shape[:-2] != second.qdata.shape[:-2] or (
        first.in_features != second.in_features
    ):
        raise ShapeError(
            f"{name}: cannot stack rows of packed shapes {tuple(first.qdata.shape)} "
            f"and {tuple(second.qdata.shape)}"
        )
    if first.out_features != second.out_features:
        raise ShapeError(
            f"{name}: gate and up must have one out_features (F rows each), got "
            f"{first.out_features} and {second.out_features}"
        )
    if first.group_size != second.group_size:
        raise ShapeError(
            f"{name}: both halves must have one group_size, got {first.group_size} "
            f"and {second.group_size}"
        )
    if first.scale.dtype != second.scale.dtype:
        raise DTypeError(
            f"{name}: both halves must have one scale dtype, got {first.scale.dtype} "
            f"and {second.scale.dtype}"
        )
    zeros = _zeros_or_none(
        [first.zero_point, second.zero_point], [first.scale, second.scale]
    )
    return Int4Projection(
        qdata=torch.cat([first.qdata, second.qdata], dim=-2),
        scale=torch.cat([first.scale, second.scale], dim=-2),
        zero_point=None if zeros is None else torch.cat(zeros, dim=-2),
        group_size=first.group_size,
    )


def deinterleave_rows(projection: Int4Projection) -> Int4Projection:
    """Rows ``[g0, u0, g1, u1, ...]`` (gpt-oss) to ``[g0, g1, ..., u0, u1, ...]``."""
    n = projection.out_features
    if n % 2:
        raise ShapeError(f"interleaved gate/up needs an even row count, got {n}")
    order = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(-2, order.to(t.device)).contiguous()

    zero = projection.zero_point
    return Int4Projection(
        qdata=pick(projection.qdata),
        scale=pick(projection.scale),
        zero_point=None if zero is None else pick(zero),
        group_size=projection.group_size,
    )


def scheme_for(w13: Int4Projection, w2: Int4Projection) -> Int4Scheme:
    """The one :class:`Int4Scheme` both projections follow.

    Raises:
        ConfigError: when no supported group size describes both (for example group
            128 on w13 but a whole-row group on w2 of another size).
    """
    mapping = (
        Int4Mapping.ASYMMETRIC
        if w13.zero_point is not None or w2.zero_point is not None
        else Int4Mapping.SYMMETRIC
    )
    g13, g2 = w13.group_size, w2.group_size
    if g13 == g2 and g13 in SUPPORTED_GROUP_SIZES:
        return Int4Scheme(mapping=mapping, group_size=g13)
    if g13 == w13.in_features and g2 == w2.in_features:
        return Int4Scheme(mapping=mapping, group_size=-1)
    allowed = ", ".join(str(g) for g in SUPPORTED_GROUP_SIZES)
    raise ConfigError(
        f"w13 group_size={g13} (input dim {w13.in_features}) and w2 group_size={g2} "
        f"(input dim {w2.in_features}) must be one supported size ({allowed}) or both "
        "whole rows"
    )


def assemble_experts(w13: Int4Projection, w2: Int4Projection) -> QuantizedExpertWeights:
    """Canonical expert weights from stacked ``w13`` ``(E, 2F, ...)`` and ``w2``.

    Raises:
        ShapeError, DTypeError, ConfigError: on inconsistent shapes, dtypes or groups.
    """
    if (
        w13.qdata.ndim != 3
        or w2.qdata.ndim != 3
        or w13.qdata.shape[0] != w2.qdata.shape[0]
    ):
        raise ShapeError(
            f"w13 and w2 must be stacked (E, N, K/2) with one E, got packed shapes "
            f"{tuple(w13.qdata.shape)} and {tuple(w2.qdata.shape)}"
        )
    e, h, d = w13.qdata.shape[0], w13.out_features, w13.in_features
    if h % 2 or w2.out_features != d or w2.in_features != h // 2:
        raise ShapeError(
            f"w13 must be (E, 2F, D) and w2 (E, D, F); got w13 (E={e}, {h}, {d}) and "
            f"w2 ({w2.out_features}, {w2.in_features})"
        )
    if w13.scale.dtype != w2.scale.dtype:
        raise DTypeError(
            f"w13 and w2 scales must share one dtype, got {w13.scale.dtype} and "
            f"{w2.scale.dtype}"
        )
    scheme = scheme_for(w13, w2)
    z13, z2 = w13.zero_point, w2.zero_point
    if scheme.has_zero_point:
        filled = _zeros_or_none([z13, z2], [w13.scale, w2.scale])
        assert filled is not None
        z13, z2 = filled
    return QuantizedExpertWeights(
        w13_qdata=w13.qdata,
        w13_scale=w13.scale,
        w13_zero_point=z13,
        w2_qdata=w2.qdata,
        w2_scale=w2.scale,
        w2_zero_point=z2,
        scheme=scheme,
    )


def assemble_per_expert(
    gate: Sequence[Int4Projection],
    up: Sequence[Int4Projection],
    down: Sequence[Int4Projection],
) -> QuantizedExpertWeights:
    """Canonical weights from one gate, up and down projection per expert.

    Mixtral's naming maps as ``w1`` = gate, ``w3`` = up, ``w2`` = down.
    """
    if not len(gate) == len(up) == len(down):
        raise ShapeError(
            f"need one gate, up and down projection per expert, got {len(gate)}, "
            f"{len(up)} and {len(down)}"
        )
    w13 = concat_rows(
        "w13", stack_projections("gate", gate), stack_projections("up", up)
    )
    return assemble_experts(w13, stack_projections("down", down))


def split_experts(
    weights: QuantizedExpertWeights,
) -> tuple[Int4Projection, Int4Projection]:
    """Stacked ``w13`` and ``w2`` projections of canonical weights (for exporting)."""
    scheme = weights.scheme
    d, f = weights.hidden_size, weights.intermediate_size
    return (
        Int4Projection(
            qdata=weights.w13_qdata,
            scale=weights.w13_scale,
            zero_point=weights.w13_zero_point,
            group_size=scheme.group_size_for(d),
        ),
        Int4Projection(
            qdata=weights.w2_qdata,
            scale=weights.w2_scale,
            zero_point=weights.w2_zero_point,
            group_size=scheme.group_size_for(f),
        ),
    )
