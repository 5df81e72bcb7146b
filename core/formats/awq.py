"""AWQ (AutoAWQ, GEMM version) int4 tensors to the canonical layout. Pure.

AWQ stores ``qweight`` int32 ``(K, N/8)`` packed along **N**: within a word, nibble
``i`` holds output column ``8c + [0, 2, 4, 6, 1, 3, 5, 7][i]``; ``qzeros`` int32
``(K/G, N/8)`` with the same interleave; ``scales`` ``(K/G, N)``. Always asymmetric:
``w[k, n] = (q[k, n] - z[k // G, n]) * scales[k // G, n]``.
Shape legend: ``N`` out, ``K`` in, ``G`` groups, ``W`` words. Imports torch and core.
"""

from typing import Final

import torch

from core.errors import ShapeError
from core.formats.projection import (
    Int4Projection,
    check_int32,
    check_leading,
    check_ndim,
    group_size_of,
    make_projection,
    unpack_words,
)

AWQ_PACK_ORDER: Final = (0, 2, 4, 6, 1, 3, 5, 7)
"""Nibble ``i`` of a word holds element ``AWQ_PACK_ORDER[i]`` of its 8 columns."""
AWQ_UNPACK_ORDER: Final = (0, 4, 1, 5, 2, 6, 3, 7)
"""Element ``j`` of a word's 8 columns lives in nibble ``AWQ_UNPACK_ORDER[j]``."""


def from_awq(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    qzeros: torch.Tensor,
    *,
    group_size: int | None = None,
) -> Int4Projection:
    """Convert one AWQ projection (or a stack with leading dims) exactly.

    Args:
        qweight: int32 ``(..., K, N/8)``.
        scales: ``(..., K/G, N)``.
        qzeros: int32 ``(..., K/G, N/8)``.
        group_size: declared group size (``-1``, or at least ``K`` with one scale
            row: one group per row), checked against the shapes; ``None``: inferred
            (see :func:`~core.formats.projection.group_size_of`).

    Raises:
        ShapeError, DTypeError, ConfigError: on malformed input.
    """
    check_int32("qweight", qweight)
    check_int32("qzeros", qzeros)
    check_ndim("qweight", qweight, 2)
    codes_KN = unpack_words(qweight, AWQ_UNPACK_ORDER)
    k, n = int(codes_KN.shape[-2]), int(scales.shape[-1])
    if scales.ndim != qweight.ndim or codes_KN.shape[-1] != n:
        raise ShapeError(
            f"scales must be (K/G, N) with N = 8 * qweight.shape[-1] = "
            f"{codes_KN.shape[-1]}, got {tuple(scales.shape)}"
        )
    check_leading("scales", scales, "qweight", qweight)
    check_leading("qzeros", qzeros, "qweight", qweight)
    stored = int(scales.shape[-2])
    group = group_size_of("scales", k, stored, declared=group_size)
    zeros_SN = unpack_words(qzeros, AWQ_UNPACK_ORDER)
    if tuple(zeros_SN.shape[-2:]) != (stored, n):
        raise ShapeError(
            f"qzeros must be (K/G={stored}, N/8={n // 8}), got {tuple(qzeros.shape)}"
        )
    return make_projection(
        codes_KN.transpose(-1, -2),
        scales.transpose(-1, -2),
        zeros_SN.transpose(-1, -2),
        group,
    )
